package queuectl_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type bundle struct {
	pool *pgxpool.Pool
	rdb  *redis.Client
	dq   *dispatch.Client
	ctl  *queuectl.Controller
}

func setup(t *testing.T) bundle {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	pool := testenv.Postgres(t)
	ctl, err := queuectl.New(pool, dq, "")
	if err != nil {
		t.Fatal(err)
	}
	return bundle{pool: pool, rdb: rdb, dq: dq, ctl: ctl}
}

// row is queue's controls in Postgres (a queue without a row: the zero Control).
func (b bundle) row(t *testing.T, queue string) queuectl.Control {
	t.Helper()
	ctls, err := b.ctl.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ctls {
		if c.Queue == queue {
			return c
		}
	}
	return queuectl.Control{}
}

// inBoth fails unless Redis holds Postgres's controls of queue, at its version,
// in every shard (Controls reports the oldest version any shard holds).
func (b bundle) inBoth(t *testing.T, queue string) queuectl.Control {
	t.Helper()
	pg := b.row(t, queue)
	rc, v, err := b.dq.Controls(t.Context(), queue)
	if err != nil {
		t.Fatal(err)
	}
	want := dispatch.Controls{Paused: pg.Paused, Shards: pg.Shards}
	if pg.Shards == 1 {
		want.Shards = 0 // Controls reports 0 for one shard
	}
	if pg.Rate.Limit > 0 {
		want.Rate = pg.Rate
	}
	want.KeyConcurrency, want.KeyThrottle, want.KeyWindow = pg.KeyConcurrency, pg.KeyThrottle, pg.KeyWindow
	if v != pg.Version || rc != want {
		t.Fatalf("%s: Redis holds %+v at version %d; Postgres %+v at version %d", queue, rc, v, pg, pg.Version)
	}
	return pg
}

// TestOperationsWriteBothStores: each change — pause, rate limit, shard count,
// resume, lifted limit — is in Postgres and in Redis, every shard, at the same
// version when the call returns.
func TestOperationsWriteBothStores(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	rate := validate.RateLimit{Limit: 50, Period: time.Second, Burst: 5}
	steps := []struct {
		name   string
		change func() (queuectl.Control, error)
	}{
		{"pause", func() (queuectl.Control, error) { return b.ctl.Pause(ctx, "mail") }},
		{"limit", func() (queuectl.Control, error) { return b.ctl.SetRateLimit(ctx, "mail", rate) }},
		{"3 shards", func() (queuectl.Control, error) { return b.ctl.SetShards(ctx, "mail", 3) }},
		{"resume", func() (queuectl.Control, error) { return b.ctl.Resume(ctx, "mail") }},
		{"no limit", func() (queuectl.Control, error) { return b.ctl.SetRateLimit(ctx, "mail", validate.RateLimit{}) }},
		{"2 shards", func() (queuectl.Control, error) { return b.ctl.SetShards(ctx, "mail", 2) }},
	}
	var last int64
	for _, s := range steps {
		got, err := s.change()
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		pg := b.inBoth(t, "mail")
		if got != pg || got.Version <= last {
			t.Fatalf("%s returned %+v; Postgres holds %+v (version before %d)", s.name, got, pg, last)
		}
		last = got.Version
	}
	if c := b.row(t, "mail"); c.Paused || c.Rate.Limit != 0 || c.Shards != 2 {
		t.Fatalf("after the steps: %+v", c)
	}
	// The shards of the old count were told the new one (enqueue.lua refuses a
	// call routed by 3 there).
	k, err := dispatch.ShardKeys(b.dq.Config().Prefix, "mail", 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := b.rdb.HGet(ctx, k.Control, "n").Result(); err != nil || n != "2" {
		t.Fatalf("shard 2 of the old count holds n %q (%v), want 2", n, err)
	}
}

// TestRedisFailureAfterCommit: with Redis unreachable, a pause and a rate limit
// are committed in Postgres and reported as ErrNotMirrored, with the committed
// controls; Restore (the relay's repair) then brings Redis to them. A shard
// change asks Redis first, so it fails before writing anything.
func TestRedisFailureAfterCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = down.Close() })
	dqDown, err := dispatch.New(down, dispatch.Config{Prefix: b.dq.Config().Prefix})
	if err != nil {
		t.Fatal(err)
	}
	ctlDown, err := queuectl.New(b.pool, dqDown, "")
	if err != nil {
		t.Fatal(err)
	}

	p, err := ctlDown.Pause(ctx, "mail")
	if !errors.Is(err, queuectl.ErrNotMirrored) || !p.Paused || p.Version < 1 {
		t.Fatalf("pause with Redis down: %+v, %v; want the committed controls and ErrNotMirrored", p, err)
	}
	t.Logf("the error: %v", err)
	r, err := ctlDown.SetRateLimit(ctx, "mail", validate.RateLimit{Limit: 7})
	if !errors.Is(err, queuectl.ErrNotMirrored) || r.Rate.Limit != 7 || r.Version <= p.Version {
		t.Fatalf("limit with Redis down: %+v, %v", r, err)
	}
	if pg := b.row(t, "mail"); pg != r {
		t.Fatalf("Postgres holds %+v, want the committed %+v", pg, r)
	}
	if _, v, err := b.dq.Controls(ctx, "mail"); err != nil || v != 0 {
		t.Fatalf("Redis holds version %d (%v), want none", v, err)
	}
	if _, err := ctlDown.SetShards(ctx, "mail", 3); err == nil || errors.Is(err, queuectl.ErrNotMirrored) {
		t.Fatalf("shards with Redis down: %v, want a failure before the commit", err)
	}
	if pg := b.row(t, "mail"); pg != r {
		t.Fatalf("the failed shard change wrote Postgres: %+v, want %+v", pg, r)
	}

	n, err := queuectl.Restore(ctx, b.pool, b.dq, "", true)
	if err != nil || n != 1 {
		t.Fatalf("Restore, dry run: %d, %v; want 1 behind", n, err)
	}
	if n, err := queuectl.Restore(ctx, b.pool, b.dq, "", false); err != nil || n != 1 {
		t.Fatalf("Restore: %d, %v; want 1 restored", n, err)
	}
	b.inBoth(t, "mail")
	if n, err := queuectl.Restore(ctx, b.pool, b.dq, "", false); err != nil || n != 0 {
		t.Fatalf("Restore again: %d, %v; want 0", n, err)
	}
}

// TestConcurrentChanges: changes of one queue from many goroutines, each through
// its own Controller, end with Redis at Postgres's newest version and controls,
// also while the relay's repair runs among them.
func TestConcurrentChanges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	if _, err := b.ctl.SetShards(ctx, "mail", 3); err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers*each+each)
	for w := range writers {
		c, err := queuectl.New(b.pool, b.dq, "")
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for i := range each {
				var err error
				switch (w + i) % 4 {
				case 0:
					_, err = c.Pause(ctx, "mail")
				case 1:
					_, err = c.Resume(ctx, "mail")
				case 2:
					_, err = c.SetRateLimit(ctx, "mail", validate.RateLimit{Limit: 1 + w*each + i})
				case 3:
					_, err = c.SetRateLimit(ctx, "mail", validate.RateLimit{})
				}
				if err != nil {
					errs <- fmt.Errorf("writer %d, change %d: %w", w, i, err)
				}
			}
		})
	}
	wg.Go(func() {
		for range each {
			if _, err := queuectl.Restore(ctx, b.pool, b.dq, "", false); err != nil {
				errs <- fmt.Errorf("restore: %w", err)
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	pg := b.inBoth(t, "mail")
	if want := int64(1 + writers*each); pg.Version != want {
		t.Fatalf("version %d, want %d (one per change)", pg.Version, want)
	}
}

// TestSetShards: the count changes only while the queue is empty in both stores;
// a refusal is ErrQueueNotEmpty and writes nothing anywhere; the same count is a
// success that bumps nothing; bad input is typed.
func TestSetShards(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	if validate.MaxShards != dispatch.MaxShards {
		t.Fatalf("validate.MaxShards %d, delayq.MaxShards %d: they must agree", validate.MaxShards, dispatch.MaxShards)
	}
	c1, err := b.ctl.SetShards(ctx, "mail", 4)
	if err != nil || c1.Shards != 4 || c1.Version < 1 {
		t.Fatalf("4 shards: %+v, %v", c1, err)
	}
	if c, err := b.ctl.SetShards(ctx, "mail", 4); err != nil || c != c1 {
		t.Fatalf("4 shards again: %+v, %v; want %+v", c, err, c1)
	}
	c2, err := b.ctl.SetShards(ctx, "mail", 16)
	if err != nil || c2.Shards != 16 || c2.Version != c1.Version+1 {
		t.Fatalf("16 shards: %+v, %v", c2, err)
	}
	if p, err := b.ctl.Pause(ctx, "mail"); err != nil || p.Shards != 16 || !p.Paused || p.Version != c2.Version+1 {
		t.Fatalf("pause: %+v, %v", p, err)
	}
	c3 := b.inBoth(t, "mail")

	for _, n := range []int{0, -3, 65} {
		if _, err := b.ctl.SetShards(ctx, "mail", n); !errors.Is(err, validate.ErrInvalidShards) {
			t.Errorf("%d shards: %v, want ErrInvalidShards", n, err)
		}
	}
	if _, err := b.ctl.SetShards(ctx, "no queue", 2); !errors.Is(err, validate.ErrInvalidQueue) {
		t.Errorf("bad queue: %v, want ErrInvalidQueue", err)
	}
	if c := b.inBoth(t, "mail"); c != c3 {
		t.Errorf("refused input wrote: %+v, want %+v", c, c3)
	}

	// A pending row: refused by Postgres.
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Enqueue(ctx, b.pool, outbox.Task{Queue: "mail", ID: "m-1", Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	_, err = b.ctl.SetShards(ctx, "mail", 2)
	var ne *queuectl.NotEmptyError
	if !errors.Is(err, taskstate.ErrQueueNotEmpty) || !errors.As(err, &ne) || ne.Shards != 16 {
		t.Fatalf("a pending task: %v, want a NotEmptyError keeping 16", err)
	}
	if c := b.inBoth(t, "mail"); c != c3 {
		t.Errorf("a refusal wrote: %+v, want %+v", c, c3)
	}
	if c, err := b.ctl.SetShards(ctx, "mail", 16); err != nil || c != c3 {
		t.Errorf("a pending task, the same count: %+v, %v; want %+v", c, err, c3)
	}

	// A task in Redis only (no row): refused by the Redis check.
	if _, err := b.dq.Enqueue(ctx, "direct", dispatch.Task{ID: "d-1", RunAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ctl.SetShards(ctx, "direct", 2); !errors.Is(err, taskstate.ErrQueueNotEmpty) {
		t.Fatalf("a task in Redis: %v, want ErrQueueNotEmpty", err)
	}
	if c := b.row(t, "direct"); c != (queuectl.Control{}) {
		t.Fatalf("a refusal wrote %+v", c)
	}
}

// TestNewRefusesATransaction: the Redis write follows the statement's commit,
// which a caller's transaction would hold back.
func TestNewRefusesATransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := queuectl.New(tx, b.dq, ""); !errors.Is(err, queuectl.ErrTransaction) {
		t.Fatalf("New on a transaction: %v, want ErrTransaction", err)
	}
}
