package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/tempserver"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// A row due now and one due within the horizon reach Redis with their due time
// and are marked queued; one beyond the horizon stays pending. A row enqueued
// while the relay is idle arrives through LISTEN, long before the poll interval.
func TestRelayMovesRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now()
	b.enqueue(t,
		task("mail", "now"),
		outbox.Task{Queue: "pay", ID: "soon", Payload: []byte("p"), RunAt: now.Add(10 * time.Minute), MaxAttempts: 3},
		outbox.Task{Queue: "pay", ID: "later", Payload: []byte("p"), RunAt: now.Add(2 * time.Hour)},
	)
	rl := b.start(t, relay.Config{PollInterval: time.Minute})
	b.waitStates(t, 10*time.Second, map[string]int{"pending": 1, "queued": 2})

	if got := b.ready(t, "mail"); !slices.Equal(got, []string{"now"}) {
		t.Errorf("mail ready = %v", got)
	}
	soon := b.info(t, "pay", "soon")
	if soon.State != dispatch.StateReady || !soon.Score.Equal(ceilMilli(now.Add(10*time.Minute))) ||
		soon.MaxAttempts != 3 || soon.Version != 1 || string(soon.Payload) != "p" {
		t.Errorf("pay/soon in Redis = %+v", soon)
	}
	if st := b.info(t, "pay", "later").State; st != dispatch.StateMissing {
		t.Errorf("pay/later (beyond the horizon) in Redis: %s", st)
	}
	if b.state(t, "pay", "later") != "pending" {
		t.Errorf("pay/later not pending")
	}

	// The relay is idle now, waiting up to a minute: a notification wakes it.
	t0 := time.Now()
	b.enqueue(t, task("mail", "woken"))
	b.waitStates(t, 10*time.Second, map[string]int{"pending": 1, "queued": 3})
	t.Logf("enqueue to queued while idle: %v", time.Since(t0))
	// The round counts its rows after its commit, which waitStates may see first.
	eventually(t, 5*time.Second, func() (bool, string) {
		got := rl.metric(t, "delayq_relay_rows_total", "result", "added")
		return got == 3, fmt.Sprintf("rows added = %v, want 3", got)
	})
	if got := rl.metric(t, "delayq_relay_batch_duration_seconds"); got < 2 {
		t.Errorf("batch duration observations = %v, want 2 or more", got)
	}
}

// 50,000 rows committed by many producers while three relays run side by side:
// each row ends in Redis exactly once, every row queued, none pending.
func TestManyProducersThreeRelays(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("50,000 rows")
	}
	// Relays on a Redis client that never retries: go-redis resends a pipeline
	// after a read timeout (harmless, the scripts are idempotent, but it would
	// count as duplicates here, on a loaded machine).
	_, prefix := testenv.Redis(t)
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	opt.MaxRetries, opt.ReadTimeout = -1, time.Minute
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	b := newBundle(t, rdb, prefix)
	const (
		total     = 50_000
		producers = 8
		chunk     = 250
		queues    = 4
	)
	var relays []running
	for range 3 {
		relays = append(relays, b.start(t, relay.Config{PollInterval: time.Minute}))
	}

	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := range producers {
		wg.Go(func() {
			ctx := ctxT(t)
			for start := p * total / producers; start < (p+1)*total/producers; start += chunk {
				tasks := make([]outbox.Task, 0, chunk)
				for i := start; i < min(start+chunk, (p+1)*total/producers); i++ {
					tasks = append(tasks, task(fmt.Sprintf("q%d", i%queues), fmt.Sprintf("task-%06d", i)))
				}
				tx, err := b.pool.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				if _, err := b.ob.EnqueueMany(ctx, tx, tasks); err != nil {
					tx.Rollback(ctx) //nolint:errcheck
					errs <- err
					return
				}
				if err := tx.Commit(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("producer: %v", err)
	}
	produced := time.Since(t0)
	b.waitStates(t, 2*time.Minute, map[string]int{"queued": total})
	t.Logf("%d rows: produced in %v, all queued %v after the first commit", total, produced.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))

	for q := range queues {
		queue := fmt.Sprintf("q%d", q)
		got := b.ready(t, queue)
		var want []string
		for i := q; i < total; i += queues {
			want = append(want, fmt.Sprintf("task-%06d", i))
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: %d ids in Redis, want %d (first difference at %d)", queue, len(got), len(want), firstDiff(got, want))
		}
		k, _ := b.dq.Keys(queue)
		if n, err := b.rdb.ZCard(ctxT(t), k.Ready).Result(); err != nil || n != int64(total/queues) {
			t.Errorf("ZCARD %s = %d, %v; want %d", k.Ready, n, err, total/queues)
		}
	}
	var added, dup float64
	for i, r := range relays {
		a := r.metric(t, "delayq_relay_rows_total", "result", "added")
		t.Logf("relay %d moved %v rows", i, a)
		added += a
		dup += r.metric(t, "delayq_relay_rows_total", "result", "duplicate")
	}
	if added != total || dup != 0 {
		var errs float64
		for _, r := range relays {
			errs += r.metric(t, "delayq_relay_errors_total")
		}
		t.Errorf("relays added %v rows and found %v duplicates, want %d and 0 (each row relayed once); %v errors",
			added, dup, total, errs)
	}
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// A failure after the Redis write and before the commit leaves the rows pending;
// the next round moves them again and Redis holds each once.
func TestFailureAfterRedisWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := []string{"a", "b", "c", "d", "e"}
	var tasks []outbox.Task
	for _, id := range ids {
		tasks = append(tasks, task("q", id))
	}
	b.enqueue(t, tasks...)

	var calls atomic.Int32
	hookErr := make(chan error, 2)
	hook := func() error {
		switch calls.Add(1) {
		case 1:
			// The tasks are in Redis already.
			if got := b.ready(t, "q"); !slices.Equal(got, ids) {
				hookErr <- fmt.Errorf("first round, before the commit: Redis holds %v", got)
			}
			return errors.New("crash between Redis and the commit")
		case 2:
			// The first round rolled back: the rows are still pending.
			if st := b.states(t); st["pending"] != len(ids) {
				hookErr <- fmt.Errorf("second round: states %v, want all pending", st)
			}
		}
		return nil
	}
	cfg := relay.WithAfterEnqueue(relay.Config{BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, hook)
	rl := b.start(t, cfg)
	b.waitStates(t, 10*time.Second, map[string]int{"queued": len(ids)})
	close(hookErr)
	for err := range hookErr {
		t.Error(err)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("%d rounds moved rows, want 2", n)
	}
	if got := b.ready(t, "q"); !slices.Equal(got, ids) {
		t.Errorf("Redis holds %v, want %v once each", got, ids)
	}
	for _, id := range ids {
		if ti := b.info(t, "q", id); ti.State != dispatch.StateReady || ti.Attempt != 0 {
			t.Errorf("q/%s in Redis: %+v", id, ti)
		}
	}
	if a, d := rl.metric(t, "delayq_relay_rows_total", "result", "added"), rl.metric(t, "delayq_relay_rows_total", "result", "duplicate"); a != 0 || d != 5 {
		// The first round's statuses are not counted: it did not commit.
		t.Errorf("rows added %v, duplicate %v; want 0 and 5 (the second round found them in Redis)", a, d)
	}
	if e := rl.metric(t, "delayq_relay_errors_total", "kind", "postgres"); e != 1 {
		t.Errorf("postgres errors = %v, want 1", e)
	}
}

// Redis stopped for a while and started again, empty: the relay logs the outage
// once, backs off, resumes by itself, and every row committed while Redis was
// down arrives. (Self-healing, which restores the rows queued before, is off
// here; TestSelfHealsAfterFlush and the fault suite cover it.)
func TestRedisRestart(t *testing.T) {
	t.Parallel()
	own := testenv.OwnRedis(t)
	rdb := testenv.RedisClient(t, own.URL())
	b := newBundle(t, rdb, "dq")
	logs := &logRecorder{next: testLogger(t).Handler()}
	rl := b.start(t, relay.Config{
		RepairRate:   -1,
		PollInterval: time.Minute,
		BackoffMin:   20 * time.Millisecond,
		BackoffMax:   200 * time.Millisecond,
		ReapInterval: 50 * time.Millisecond,
		Logger:       slog.New(logs),
	})
	batch := func(prefix string, n int) []outbox.Task {
		var ts []outbox.Task
		for i := range n {
			ts = append(ts, task("q", fmt.Sprintf("%s-%03d", prefix, i)))
		}
		return ts
	}
	b.enqueue(t, batch("before", 100)...)
	b.waitStates(t, 10*time.Second, map[string]int{"queued": 100})

	own.Stop()
	b.enqueue(t, batch("during", 100)...)
	// The relay has tried and failed while Redis was down. (Each attempt takes a
	// while: go-redis retries the dial and the command before it gives up.)
	eventually(t, 30*time.Second, func() (bool, string) {
		n := rl.metric(t, "delayq_relay_errors_total", "kind", "redis")
		return n >= 2, fmt.Sprintf("%v Redis errors", n)
	})
	if st := b.states(t); st["pending"] != 100 {
		t.Errorf("while Redis is down: states %v, want 100 pending", st)
	}
	if err := own.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	b.waitStates(t, 20*time.Second, map[string]int{"queued": 200})
	// go-redis's pool, after as many failed dials as its size, answers with the
	// last dial error until its probe (one a second) reaches the server again; the
	// relay's rounds now ask Redis during the outage often enough to trip it, and
	// its connections dialled since may all be busy when the test asks.
	eventually(t, 5*time.Second, func() (bool, string) {
		err := b.rdb.Ping(ctxT(t)).Err()
		return err == nil, fmt.Sprint(err)
	})

	got := b.ready(t, "q")
	var want []string
	for _, ts := range batch("during", 100) {
		want = append(want, ts.ID)
	}
	// A restart without persistence lost the "before" tasks (self-healing, off
	// here, restores them from their queued rows); everything committed during
	// the outage is here.
	if !slices.Equal(got, want) {
		t.Errorf("Redis holds %d tasks after the restart, want the 100 committed during the outage: %v", len(got), got)
	}
	eventually(t, 5*time.Second, func() (bool, string) {
		n := logs.count("Redis reachable again")
		return n == 1, fmt.Sprintf("%d 'reachable again' logs", n)
	})
	if n := logs.count("Redis unreachable"); n != 1 {
		t.Errorf("%d 'Redis unreachable' logs for one outage, want 1", n)
	}
	if n := logs.count("PostgreSQL"); n != 0 {
		t.Errorf("%d PostgreSQL logs, want none", n)
	}
}

// Rows beyond the horizon stay in Postgres, out of Redis, and arrive when they
// come within it, woken by the relay's timer (the poll interval is a minute).
func TestHorizon(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const horizon = 300 * time.Millisecond
	rl := b.start(t, relay.Config{Horizon: horizon, PollInterval: time.Minute})
	_ = rl
	b.enqueue(t,
		task("q", "now"),
		outbox.Task{Queue: "q", ID: "later", Payload: []byte("x"), Delay: 1500 * time.Millisecond},
	)
	b.waitStates(t, 10*time.Second, map[string]int{"pending": 1, "queued": 1})
	if st := b.info(t, "q", "later").State; st != dispatch.StateMissing {
		t.Fatalf("q/later in Redis before it came within the horizon: %s", st)
	}
	b.waitStates(t, 10*time.Second, map[string]int{"queued": 2})

	var runAt, queuedAt time.Time
	if err := b.pool.QueryRow(ctxT(t), `SELECT run_at, queued_at FROM delayq_outbox WHERE task_id = 'later'`).Scan(&runAt, &queuedAt); err != nil {
		t.Fatal(err)
	}
	if early := runAt.Sub(queuedAt); early > horizon || early < 0 {
		t.Errorf("q/later relayed %v before its run_at, want within the horizon (0..%v)", early, horizon)
	}
	if ti := b.info(t, "q", "later"); ti.State != dispatch.StateReady || !ti.Score.Equal(ceilMilli(runAt)) {
		t.Errorf("q/later in Redis: %+v, want ready at %v", ti, runAt)
	}
}

// A rolled-back enqueue never reaches Redis.
func TestRolledBackEnqueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rl := b.start(t, relay.Config{PollInterval: time.Minute})
	ctx := ctxT(t)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ob.Enqueue(ctx, tx, task("q", "rolled-back")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, task("q", "committed"))
	b.waitStates(t, 10*time.Second, map[string]int{"queued": 1})
	if got := b.ready(t, "q"); !slices.Equal(got, []string{"committed"}) {
		t.Errorf("Redis holds %v, want only the committed task", got)
	}
	if st := b.info(t, "q", "rolled-back").State; st != dispatch.StateMissing {
		t.Errorf("rolled-back task in Redis: %s", st)
	}
	// The round counts its rows after its commit: the count may lag the state.
	eventually(t, 5*time.Second, func() (bool, string) {
		a := rl.metric(t, "delayq_relay_rows_total", "result", "added")
		return a == 1, fmt.Sprintf("rows added = %v, want 1", a)
	})
}

// Retention deletes done and cancelled rows older than the window, in batches;
// dead rows, recent rows and live rows stay.
func TestRetention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	insert := func(prefix, state string, n int, doneAgo time.Duration) {
		t.Helper()
		_, err := b.pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, done_at, created_at)
SELECT 'q', $1 || '-' || i, now() - interval '3 days', 'x', 1, $2,
       CASE WHEN $2 IN ('pending', 'queued') THEN NULL ELSE now() - $3::bigint * interval '1 microsecond' END,
       now() - interval '3 days'
FROM generate_series(1, $4) AS i`, prefix, state, doneAgo.Microseconds(), n)
		if err != nil {
			t.Fatal(err)
		}
	}
	insert("old-done", "done", 7, 2*time.Hour)
	insert("old-cancelled", "cancelled", 4, 2*time.Hour)
	insert("old-dead", "dead", 3, 2*time.Hour)
	insert("new-done", "done", 2, 30*time.Minute)
	insert("new-cancelled", "cancelled", 1, 30*time.Minute)
	insert("pending", "pending", 2, 0)
	insert("queued", "queued", 2, 0)

	reg := prometheus.NewRegistry()
	rl, err := relay.New(b.pool, b.dq.AsRedis(), relay.Config{Retention: time.Hour, RetentionBatch: 3, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	deleted, batches, err := rl.Prune(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if deleted != 11 || batches != 4 {
		t.Errorf("Prune deleted %d rows in %d batches, want 11 in 4 (3+3+3+2)", deleted, batches)
	}
	if st := b.states(t); fmt.Sprint(st) != fmt.Sprint(map[string]int{"cancelled": 1, "dead": 3, "done": 2, "pending": 2, "queued": 2}) {
		t.Errorf("after Prune: %v", st)
	}
	var left []string
	rows, _ := b.pool.Query(ctx, `SELECT task_id FROM delayq_outbox WHERE task_id LIKE 'old-%' ORDER BY task_id`)
	for rows.Next() {
		var id string
		rows.Scan(&id) //nolint:errcheck
		left = append(left, id)
	}
	if rows.Err() != nil || !slices.Equal(left, []string{"old-dead-1", "old-dead-2", "old-dead-3"}) {
		t.Errorf("old rows left: %v (%v), want the dead ones only", left, rows.Err())
	}
	if deleted, batches, err := rl.Prune(ctx); deleted != 0 || batches != 1 || err != nil {
		t.Errorf("second Prune: %d rows, %d batches, %v; want 0, 1, nil", deleted, batches, err)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "delayq_relay_retention_deleted_total" && mf.GetMetric()[0].GetCounter().GetValue() != 11 {
			t.Errorf("retention metric = %v, want 11", mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
}

// The reaper takes back expired leases: a task with attempts left is requeued; a
// task without is dead in Redis and mirrored into Postgres with its error; a row
// already done in Postgres is left alone.
func TestReaper(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	b := newBundle(t, rdb, prefix)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix, ReapBackoffBase: time.Millisecond, ReapBackoffMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	b.enqueue(t,
		outbox.Task{Queue: "q", ID: "dies", MaxAttempts: 1},
		outbox.Task{Queue: "q", ID: "retries", MaxAttempts: 3},
		outbox.Task{Queue: "q", ID: "done", MaxAttempts: 1},
	)
	rl := b.startDQ(t, dq, relay.Config{ReapInterval: 20 * time.Millisecond, QueueRefresh: 20 * time.Millisecond})
	b.waitStates(t, 10*time.Second, map[string]int{"queued": 3})

	// The lease outlasts the markDone below: the reaper must find "done"
	// finished in Postgres, not settle it dead first (a 1 ms lease lost that
	// race once in CI).
	cl, err := dq.Claim(ctxT(t), "q", 10, time.Second)
	if err != nil || len(cl.Tasks) != 3 {
		t.Fatalf("Claim: %d tasks, %v", len(cl.Tasks), err)
	}
	// The worker of "done" committed in Postgres and crashed before acking Redis.
	if !markDone(t, b.pool, "q", "done", 1) {
		t.Fatal("MarkDone refused")
	}
	eventually(t, 10*time.Second, func() (bool, string) {
		st := b.state(t, "q", "dies")
		return st == "dead", "q/dies is " + st
	})
	var lastErr string
	var attempt int
	if err := b.pool.QueryRow(ctxT(t), `SELECT last_error, attempt FROM delayq_outbox WHERE task_id = 'dies'`).Scan(&lastErr, &attempt); err != nil {
		t.Fatal(err)
	}
	if lastErr != dispatch.LeaseExpiredError || attempt != 1 {
		t.Errorf("q/dies: last_error %q, attempt %d; want %q, 1", lastErr, attempt, dispatch.LeaseExpiredError)
	}
	eventually(t, 10*time.Second, func() (bool, string) {
		ti := b.info(t, "q", "retries")
		return ti.State == dispatch.StateReady, fmt.Sprintf("q/retries in Redis: %s", ti.State)
	})
	if st := b.state(t, "q", "retries"); st != "queued" {
		t.Errorf("q/retries in Postgres: %s, want queued", st)
	}
	// The worker of "done" committed before it died: Postgres keeps the row done,
	// and Redis follows it. Nothing of the task stays in Redis (no dead hash
	// without an end, as a Redis-first reaper left).
	eventually(t, 10*time.Second, func() (bool, string) {
		ti := b.info(t, "q", "done")
		return ti.State == dispatch.StateMissing, fmt.Sprintf("q/done in Redis: %s", ti.State)
	})
	if st := b.state(t, "q", "done"); st != "done" {
		t.Errorf("q/done in Postgres: %s, want done (the guard keeps finished rows)", st)
	}
	// The counts follow the settling's Redis write by a moment.
	eventually(t, 5*time.Second, func() (bool, string) {
		d, f := rl.metric(t, "delayq_relay_reaped_total", "result", "dead"), rl.metric(t, "delayq_relay_reaped_total", "result", "finished")
		return d == 1 && f == 1, fmt.Sprintf("reaped dead = %v, finished = %v; want 1, 1", d, f)
	})
	if r := rl.metric(t, "delayq_relay_reaped_total", "result", "requeued"); r < 1 {
		t.Errorf("reaped requeued = %v, want at least 1", r)
	}
}

// Shutdown in the middle of a round: the round in hand is finished and committed,
// and Run returns nil.
func TestShutdownFinishesRound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, task("q", "a"), task("q", "b"))
	ctx, cancel := context.WithCancel(ctxT(t))
	hook := func() error {
		cancel() // SIGTERM arrives between the Redis write and the commit
		return nil
	}
	rl, err := relay.New(b.pool, b.dq.AsRedis(), relay.WithAfterEnqueue(relay.Config{Logger: testLogger(t)}, hook))
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Run(ctx); err != nil {
		t.Fatalf("Run: %v, want nil", err)
	}
	if st := b.states(t); st["queued"] != 2 {
		t.Errorf("after shutdown: %v, want the round in hand committed", st)
	}
	if err := rl.Run(ctx); !errors.Is(err, relay.ErrRunning) {
		t.Errorf("second Run: %v, want ErrRunning", err)
	}
}

// Rows no Redis key can hold (a queue name or an id written by hand, or by an older
// version) are set dead with the reason, and the round goes on: one poison row does
// not stop the relay for every queue. A payload within the outbox's limits is moved
// whatever the Redis client's own MaxPayloadBytes: the limits are one set.
func TestPoisonRowsSetDead(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	b := newBundle(t, rdb, prefix)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix, MaxPayloadBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	b.enqueue(t,
		outbox.Task{Queue: "q", ID: "big", Payload: []byte(strings.Repeat("x", 32))},
		outbox.Task{Queue: "q", ID: "small", Payload: []byte("ok")},
	)
	if _, err := b.pool.Exec(ctxT(t), `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts)
VALUES ('bad queue', 'a', now(), 'p', 3), ('q', 'x{y}', now(), 'p', 3)`); err != nil {
		t.Fatal(err)
	}
	rl := b.startDQ(t, dq, relay.Config{})
	b.waitStates(t, 10*time.Second, map[string]int{"dead": 2, "queued": 2})
	for _, k := range [][2]string{{"bad queue", "a"}, {"q", "x{y}"}} {
		var lastErr string
		if err := b.pool.QueryRow(ctxT(t), `SELECT last_error FROM delayq_outbox WHERE queue = $1 AND task_id = $2 AND state = 'dead'`,
			k[0], k[1]).Scan(&lastErr); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(lastErr, "Redis cannot hold") || !strings.Contains(lastErr, "invalid") {
			t.Errorf("%s/%s: last_error %q", k[0], k[1], lastErr)
		}
	}
	if got := b.ready(t, "q"); !slices.Equal(got, []string{"big", "small"}) {
		t.Errorf("Redis holds %v, want both valid rows", got)
	}
	if n := rl.metric(t, "delayq_relay_rows_total", "result", "invalid"); n != 2 {
		t.Errorf("invalid rows = %v, want 2", n)
	}
}

// Config.Queues limits the relay to its queues.
func TestQueuesFilter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, relay.Config{Queues: []string{"mine"}, PollInterval: time.Minute})
	b.enqueue(t, task("other", "1"), task("mine", "1"))
	eventually(t, 10*time.Second, func() (bool, string) {
		st := b.state(t, "mine", "1")
		return st == "queued", "mine/1 is " + st
	})
	b.enqueue(t, task("mine", "2"))
	eventually(t, 10*time.Second, func() (bool, string) {
		st := b.state(t, "mine", "2")
		return st == "queued", "mine/2 is " + st
	})
	if st := b.state(t, "other", "1"); st != "pending" {
		t.Errorf("other/1 is %s, want pending (not this relay's queue)", st)
	}
	if got := b.ready(t, "other"); len(got) != 0 {
		t.Errorf("other in Redis: %v", got)
	}
}

// The stats refresh sets the depth by state (live and dead rows counted, finished
// ones estimated from the statistics ANALYZE keeps) and the lag of due pending rows.
func TestStats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	if _, err := b.pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, done_at)
VALUES ('q', 'late', now() - interval '90 seconds', 'x', 1, 'pending', NULL),
       ('q', 'future', now() + interval '1 day', 'x', 1, 'pending', NULL),
       ('q', 'queued', now(), 'x', 1, 'queued', NULL),
       ('q', 'dead', now(), 'x', 1, 'dead', now()),
       ('q', 'done1', now(), 'x', 1, 'done', now()),
       ('q', 'done2', now(), 'x', 1, 'done', now())`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `ANALYZE delayq_outbox`); err != nil { // what autovacuum does
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	rl, err := relay.New(b.pool, b.dq.AsRedis(), relay.Config{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.RefreshStats(ctx); err != nil {
		t.Fatal(err)
	}
	r := running{Relay: rl, reg: reg}
	for state, want := range map[string]float64{"pending": 2, "queued": 1, "dead": 1, "done": 2, "cancelled": 0} {
		if got := r.metric(t, "delayq_outbox_rows", "state", state); got != want {
			t.Errorf("depth %s = %v, want %v", state, got, want)
		}
	}
	if lag := r.metric(t, "delayq_relay_lag_seconds"); lag < 89 || lag > 120 {
		t.Errorf("lag = %vs, want about 90s", lag)
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	cfg := relay.Config{}.WithDefaults()
	if cfg.Schema != "public" || cfg.Horizon != time.Hour || cfg.BatchSize != 1000 || cfg.PollInterval != 5*time.Second ||
		cfg.ReapInterval != time.Second || cfg.Retention != 7*24*time.Hour || cfg.RetentionBatch != 1000 ||
		cfg.NotifyChannel != taskstate.DefaultNotifyChannel || cfg.Logger == nil || cfg.RepairRate != 5000 ||
		cfg.RepairBatch != 500 || cfg.RepairPause != 30*time.Second || cfg.LossCheckInterval != time.Second ||
		cfg.FollowUp != 5*time.Millisecond || cfg.FollowUpFor != 100*time.Millisecond {
		t.Errorf("defaults: %+v", cfg)
	}
	b := setup(t)
	for _, c := range []relay.Config{
		{BatchSize: -1},
		{BatchSize: 10001},
		{Horizon: -time.Second},
		{PollInterval: -1},
		{ReapInterval: -2},
		{Retention: -time.Hour},
		{BackoffMin: time.Second, BackoffMax: time.Millisecond},
		{Queues: []string{"bad queue"}},
		{Schema: "Bad-Schema"},
		{NotifyChannel: "no spaces"},
		{RepairRate: -2},
		{RepairBatch: 1001},
		{RepairPause: -time.Second},
		{LossCheckInterval: -1},
		{LeaderRetry: -time.Second},
		{OverdueAfter: -time.Minute},
		{FollowUp: -1},
		{FollowUpFor: -2},
		{FollowUp: time.Second, FollowUpFor: time.Millisecond},
		{Database: "Bad.Key"},
		{Database: "eu1"}, // the Redis client is bound to another namespace
	} {
		if _, err := relay.New(b.pool, b.dq.AsRedis(), c); !errors.Is(err, relay.ErrInvalidConfig) {
			t.Errorf("New(%+v): %v, want ErrInvalidConfig", c, err)
		}
	}
	if _, err := relay.New(nil, b.dq.AsRedis(), relay.Config{}); !errors.Is(err, relay.ErrInvalidConfig) {
		t.Errorf("New(nil pool): %v", err)
	}
	// -1 turns the reaper, the retention, the self-healing and the follow-up off.
	if _, err := relay.New(b.pool, b.dq.AsRedis(), relay.Config{ReapInterval: -1, Retention: -1, StatsInterval: -1, RepairRate: -1, FollowUpFor: -1}); err != nil {
		t.Errorf("off switches: %v", err)
	}
	reg := prometheus.NewRegistry()
	if _, err := relay.New(b.pool, b.dq.AsRedis(), relay.Config{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.New(b.pool, b.dq.AsRedis(), relay.Config{Registerer: reg}); err != nil {
		t.Errorf("second relay on one registry: %v, want the collectors shared", err)
	}
}

// Postgres stopped and started again: the relay logs the outage once, reconnects
// its pool and its LISTEN connection by itself, and moves the rows committed
// after the restart.
func TestPostgresRestart(t *testing.T) {
	t.Parallel()
	pg := testenv.OwnPostgres(t)
	rdb, prefix := testenv.Redis(t)
	b := newBundle(t, rdb, prefix)
	b.url, b.pool = pg.URL(), testenv.Pool(t, pg.URL())
	logs := &logRecorder{next: testLogger(t).Handler()}
	rl := b.start(t, relay.Config{
		PollInterval: time.Minute,
		BackoffMin:   20 * time.Millisecond,
		BackoffMax:   200 * time.Millisecond,
		Logger:       slog.New(logs),
	})
	b.enqueue(t, task("q", "before"))
	b.waitStates(t, 10*time.Second, map[string]int{"queued": 1})

	// A crash: every server process SIGKILLed, crash recovery at the next start.
	pg.Kill()
	eventually(t, 10*time.Second, func() (bool, string) {
		n := rl.metric(t, "delayq_relay_errors_total", "kind", "listen")
		return n >= 1, fmt.Sprintf("%v listen errors", n)
	})
	if err := pg.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// The producers' pool holds dead connections too; the first call may fail.
	eventually(t, 10*time.Second, func() (bool, string) {
		err := b.pool.Ping(ctxT(t))
		return err == nil, fmt.Sprint(err)
	})
	b.enqueue(t, task("q", "after"))
	b.waitStates(t, 10*time.Second, map[string]int{"queued": 2})
	if got := b.ready(t, "q"); !slices.Equal(got, []string{"after", "before"}) {
		t.Errorf("Redis holds %v", got)
	}
	eventually(t, 5*time.Second, func() (bool, string) {
		n := logs.count("PostgreSQL reachable again")
		return n == 1, fmt.Sprintf("%d 'reachable again' logs", n)
	})
	if n := logs.count("PostgreSQL unreachable"); n != 1 {
		t.Errorf("%d 'PostgreSQL unreachable' logs for one outage, want 1", n)
	}
	if n := logs.count("PostgreSQL error"); n != 0 {
		t.Errorf("%d 'PostgreSQL error' logs: the outage was not recognized as one", n)
	}
}

// A round's commit does not wait for the disk (docs/DESIGN.md, "The write-order
// rule"). Postgres killed right after a round can lose it: the row is pending
// again, and the next round's enqueue is a duplicate in Redis. A later change of
// the row commits synchronously after the round, which makes the round durable:
// a row cancelled after its round keeps its queued_at through the crash.
func TestRelayRoundLostInCrash(t *testing.T) {
	t.Parallel()
	pg := testenv.OwnPostgres(t)
	rdb, prefix := testenv.Redis(t)
	b := newBundle(t, rdb, prefix)
	b.url, b.pool = pg.URL(), testenv.Pool(t, pg.URL())
	// The WAL writer flushes asynchronous commits every wal_writer_delay: at its
	// longest, a crash right after a round finds the round's commit unflushed.
	for _, q := range []string{`ALTER SYSTEM SET wal_writer_delay = '10s'`, `SELECT pg_reload_conf()`} {
		if _, err := b.pool.Exec(ctxT(t), q); err != nil {
			t.Fatal(err)
		}
	}
	rl := b.start(t, relay.Config{PollInterval: time.Minute, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	queuedAt := func(id string) (state string, at *time.Time) {
		t.Helper()
		err := b.pool.QueryRow(ctxT(t), `SELECT state, queued_at FROM delayq_outbox WHERE queue = 'q' AND task_id = $1`, id).Scan(&state, &at)
		if err != nil {
			t.Fatal(err)
		}
		return state, at
	}
	// crash SIGKILLs every server process and starts Postgres again (crash
	// recovery), returning the time of the kill.
	crash := func() time.Time {
		t.Helper()
		at := time.Now()
		pg.Kill()
		if err := pg.Start(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, func() (bool, string) {
			err := b.pool.Ping(ctxT(t))
			return err == nil, fmt.Sprint(err)
		})
		return at
	}

	// A round is lost unless something flushed the WAL meanwhile: the WAL writer
	// wakes early when a page of WAL fills, so up to three tries.
	lost := false
	for i := range 3 {
		id := fmt.Sprintf("lost-%d", i)
		b.enqueue(t, task("q", id))
		eventually(t, 10*time.Second, func() (bool, string) {
			st := b.state(t, "q", id)
			return st == "queued", st
		})
		dups := rl.metric(t, "delayq_relay_rows_total", "result", "duplicate")
		crashed := crash()
		// The relay moves the row again by itself after the restart when it was lost.
		eventually(t, 10*time.Second, func() (bool, string) {
			st, _ := queuedAt(id)
			return st == "queued", st
		})
		if _, at := queuedAt(id); at.After(crashed) {
			lost = true
			eventually(t, 5*time.Second, func() (bool, string) {
				n := rl.metric(t, "delayq_relay_rows_total", "result", "duplicate")
				return n == dups+1, fmt.Sprintf("%v duplicates, want %v: the lost round's task should be in Redis already", n, dups+1)
			})
			if ti := b.info(t, "q", id); ti.State != dispatch.StateReady || ti.Attempt != 0 || ti.Version != 1 {
				t.Errorf("q/%s in Redis after the lost round was moved again: %+v", id, ti)
			}
			break
		}
	}
	if !lost {
		t.Fatal("no round was lost in three crashes right after it: its commit waited for the disk")
	}

	// A cancel after the round commits synchronously and flushes the round with it.
	b.enqueue(t, task("q", "kept"))
	eventually(t, 10*time.Second, func() (bool, string) {
		st := b.state(t, "q", "kept")
		return st == "queued", st
	})
	_, roundAt := queuedAt("kept")
	if err := b.ob.Cancel(ctxT(t), b.pool, "q", "kept"); err != nil {
		t.Fatal(err)
	}
	crash()
	if st, at := queuedAt("kept"); st != "cancelled" || at == nil || !at.Equal(*roundAt) {
		t.Errorf("after the crash: state %s, queued_at %v; want cancelled, queued at %v (the round kept)", st, at, roundAt)
	}
}

// On a Redis Cluster the pipelined round splits by node: queues in different
// slots all arrive, and a second relay round after an injected failure still
// finds them once.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts six Redis nodes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := tempserver.StartRedisCluster(ctx, 3)
	if err != nil {
		t.Skipf("no Redis Cluster here: %v", err)
	}
	t.Cleanup(cl.Close)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	b := newBundle(t, rdb, "dq")

	var tasks []outbox.Task
	queues := []string{"alpha", "beta", "gamma", "delta", "epsilon", "zeta"}
	for _, q := range queues {
		for i := range 50 {
			tasks = append(tasks, task(q, fmt.Sprintf("t%02d", i)))
		}
	}
	b.enqueue(t, tasks...)
	var fail atomic.Bool
	fail.Store(true)
	cfg := relay.WithAfterEnqueue(relay.Config{BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond},
		func() error {
			if fail.CompareAndSwap(true, false) {
				return errors.New("injected")
			}
			return nil
		})
	rl := b.start(t, cfg)
	b.waitStates(t, 20*time.Second, map[string]int{"queued": len(tasks)})
	for _, q := range queues {
		if got := b.ready(t, q); len(got) != 50 {
			t.Errorf("%s: %d tasks in the cluster, want 50", q, len(got))
		}
	}
	if d := rl.metric(t, "delayq_relay_rows_total", "result", "duplicate"); d != float64(len(tasks)) {
		t.Errorf("duplicates on the second round = %v, want %d", d, len(tasks))
	}
}

// ceilMilli is the due time a task enqueued through the outbox gets in Redis: the
// outbox keeps microseconds (pgx drops the nanoseconds), and the relay rounds that
// up to the millisecond. Ceiling t itself would be 1 ms off whenever its
// nanoseconds past the millisecond are under 1,000.
func ceilMilli(t time.Time) time.Time {
	t = t.Truncate(time.Microsecond)
	if c := t.Truncate(time.Millisecond); c.Before(t) {
		return c.Add(time.Millisecond)
	}
	return t
}

// The LISTEN connection is made by the pool, so the pool's BeforeConnect hook (a
// rotated password, here a marker in application_name) applies to it too.
func TestListenConnectionUsesPoolHooks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	const marker = "delayq-test-before-connect"
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		cc.RuntimeParams["application_name"] = marker
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rl, err := relay.New(pool, b.dq.AsRedis(), relay.Config{PollInterval: time.Minute, Logger: testLogger(t), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, 10*time.Second, func() (bool, string) {
		var n int
		err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND query LIKE 'LISTEN %'`, marker).Scan(&n)
		return err == nil && n == 1, fmt.Sprintf("%d LISTEN connections with the hook's marker (%v)", n, err)
	})
	// And it works: a notification wakes the relay, long before its poll.
	b.enqueue(t, task("mail", "woken"))
	b.waitStates(t, 10*time.Second, map[string]int{"queued": 1})
}

// TestRunRefusesAnUnmigratedSchema: a relay on a database whose migrations have
// not run stops at once with outbox.ErrNotMigrated and the hint, instead of
// logging an error every round.
func TestRunRefusesAnUnmigratedSchema(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool := testenv.Pool(t, testenv.EmptyPostgresURL(t))
	rl, err := relay.New(pool, b.dq.AsRedis(), relay.Config{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctxT(t), 10*time.Second)
	defer cancel()
	err = rl.Run(ctx)
	if !errors.Is(err, outbox.ErrNotMigrated) || !strings.Contains(err.Error(), "delayq migrate up") {
		t.Fatalf("Run on an unmigrated database: %v, want outbox.ErrNotMigrated with the hint", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run waited for its context instead of refusing at once")
	}
}
