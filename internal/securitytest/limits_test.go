package securitytest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// TestPayloadLimitsOnEveryPath: a payload of exactly the limit is accepted and
// one byte more is refused, with nothing written, on every way in: the four
// outbox enqueues (one bad task fails a whole EnqueueMany), delayq's Enqueue (its
// own limit, for direct enqueues), EnqueuePipelined and RepairIf (the hard limit:
// they carry rows the outbox accepted), and the enqueue command's --payload,
// --payload-file and standard input. A row that passed a larger outbox limit than
// the Redis client's own is moved by the relay all the same: the limits are one
// set.
func TestPayloadLimitsOnEveryPath(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t, 2*time.Minute)
	const limit = validate.DefaultMaxPayloadBytes
	atLimit, over := bytes.Repeat([]byte("x"), limit), bytes.Repeat([]byte("x"), limit+1)
	overHard := bytes.Repeat([]byte("x"), validate.MaxPayloadBytes+1)

	pgURL := testenv.PostgresURL(t)
	pool := testenv.Pool(t, pgURL)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	rows := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	task := func(id string, p []byte) outbox.Task { return outbox.Task{Queue: "lim", ID: id, Payload: p} }
	paths := []struct {
		name string
		enq  func(outbox.Task) error
	}{
		{"Enqueue", func(tk outbox.Task) error { _, err := ob.Enqueue(ctx, pool, tk); return err }},
		{"EnqueueSQL", func(tk outbox.Task) error { _, err := ob.EnqueueSQL(ctx, db, tk); return err }},
		{"EnqueueMany", func(tk outbox.Task) error {
			_, err := ob.EnqueueMany(ctx, pool, []outbox.Task{task(tk.ID+"-ok", []byte("small")), tk})
			return err
		}},
		{"EnqueueManySQL", func(tk outbox.Task) error {
			_, err := ob.EnqueueManySQL(ctx, db, []outbox.Task{task(tk.ID+"-ok", []byte("small")), tk})
			return err
		}},
	}
	for _, p := range paths {
		before := rows()
		if err := p.enq(task(p.name+"-over", over)); !errors.Is(err, outbox.ErrPayloadTooLarge) {
			t.Errorf("outbox %s, %d bytes: %v, want ErrPayloadTooLarge", p.name, len(over), err)
		}
		if n := rows(); n != before {
			t.Errorf("outbox %s wrote %d rows for a refused payload", p.name, n-before)
		}
		if err := p.enq(task(p.name+"-at", atLimit)); err != nil {
			t.Errorf("outbox %s, %d bytes: %v", p.name, len(atLimit), err)
		}
	}
	// A limit of one's own, and none.
	small, _ := outbox.New(outbox.Config{MaxPayloadBytes: 10})
	if _, err := small.Enqueue(ctx, pool, task("small-11", make([]byte, 11))); !errors.Is(err, outbox.ErrPayloadTooLarge) {
		t.Errorf("MaxPayloadBytes 10, 11 bytes: %v", err)
	}
	unlimited, _ := outbox.New(outbox.Config{MaxPayloadBytes: -1})
	if _, err := unlimited.Enqueue(ctx, pool, task("big", over)); err != nil {
		t.Errorf("MaxPayloadBytes -1: %v", err)
	}

	// delayq: Enqueue, EnqueuePipelined, RepairIf.
	rdb, prefix := testenv.Redis(t)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	missing := func(queue string, ids ...string) {
		t.Helper()
		info, err := dq.Inspect(ctx, queue, ids...)
		if err != nil {
			t.Fatal(err)
		}
		for _, ti := range info {
			if ti.State != dispatch.StateMissing {
				t.Errorf("%s/%s written although refused: %+v", queue, ti.ID, ti.State)
			}
		}
	}
	if _, err := dq.Enqueue(ctx, "lim", dispatch.Task{ID: "ok", Payload: []byte("small")}, dispatch.Task{ID: "over", Payload: over}); !errors.Is(err, dispatch.ErrInvalidTask) {
		t.Errorf("delayq Enqueue, %d bytes: %v, want ErrInvalidTask", len(over), err)
	}
	missing("lim", "ok", "over")
	if _, err := dq.EnqueuePipelined(ctx, []dispatch.QueueTasks{
		{Queue: "a", Tasks: []dispatch.Task{{ID: "ok"}}}, {Queue: "b", Tasks: []dispatch.Task{{ID: "over", Payload: overHard}}}}); !errors.Is(err, dispatch.ErrInvalidTask) {
		t.Errorf("EnqueuePipelined, %d bytes: %v, want ErrInvalidTask", len(overHard), err)
	}
	missing("a", "ok")
	missing("b", "over")
	if _, err := dq.RepairIf(ctx, "lim", dispatch.Repair{Op: dispatch.RepairRestore, ID: "over", Task: dispatch.Task{Payload: overHard}}); !errors.Is(err, dispatch.ErrInvalidTask) {
		t.Errorf("RepairIf restore, %d bytes: %v, want ErrInvalidTask", len(overHard), err)
	}
	missing("lim", "over")
	if st, err := dq.Enqueue(ctx, "lim", dispatch.Task{ID: "at", Payload: atLimit}); err != nil || st[0] != dispatch.Added {
		t.Errorf("delayq Enqueue, %d bytes: %v %v", len(atLimit), st, err)
	}

	// The relay: "big" (outbox without a limit of its own) is over the Redis
	// client's limit, and is moved all the same, with the rows around it.
	rl, err := relay.New(pool, dq.AsRedis(), relay.Config{PollInterval: 100 * time.Millisecond, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rl.Run(runCtx) }()
	waitFor(t, 30*time.Second, "the relay to move the rows", func() bool {
		var pending int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE state = 'pending'`).Scan(&pending)
		return pending == 0
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var queued int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE state = 'queued'`).Scan(&queued); err != nil {
		t.Fatal(err)
	}
	if want := rows(); queued != want {
		t.Errorf("%d rows queued, want all %d", queued, want)
	}
	if info, err := dq.Inspect(ctx, "lim", "big"); err != nil || info[0].State != dispatch.StateReady || !bytes.Equal(info[0].Payload, over) {
		t.Errorf("lim/big in Redis: %v %v, want ready with its %d bytes", info[0].State, err, len(over))
	}

	// The enqueue command.
	env := map[string]string{"DATABASE_URL": pgURL}
	before := rows()
	file := filepath.Join(t.TempDir(), "payload")
	if err := os.WriteFile(file, over, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, stdin string
		args        []string
	}{
		{"--payload", "", []string{"--payload", string(over)}},
		{"--payload-file", "", []string{"--payload-file", file}},
		{"standard input", string(over), []string{"--payload-file", "-"}},
	} {
		r := runBin(t, env, c.stdin, append([]string{"enqueue", "--queue", "cli", "--id", "over"}, c.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, "payload") || len(r.stderr) > 400 {
			t.Errorf("enqueue %s with %d bytes: exit %d, want 2 and a short message\n%.400s", c.name, len(over), r.code, r.out())
		}
	}
	if n := rows(); n != before {
		t.Errorf("the enqueue command wrote %d rows for refused payloads", n-before)
	}
	if r := runBin(t, env, string(atLimit), "enqueue", "--queue", "cli", "--id", "at", "--payload-file", "-"); r.code != 0 {
		t.Errorf("enqueue with %d bytes: exit %d\n%s", len(atLimit), r.code, r.out())
	}
}
