package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// TestQueuePauseUnderLoad pauses a queue with `delayq queue pause` while two
// workers drain it: once the command returns, no task is claimed (every task that
// runs afterwards was leased before); the flag removed from Redis comes back from
// Postgres by the relay; `delayq queue resume` lets the rest run, and every task
// ran exactly once.
func TestQueuePauseUnderLoad(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := 2000
	if testing.Short() {
		n = 400 // the same pause, less to drain
	}
	b.exec(t, `CREATE TABLE runs (id text NOT NULL)`)
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tasks := make([]outbox.Task, n)
	for i := range tasks {
		tasks[i] = outbox.Task{Queue: "load", ID: fmt.Sprintf("t%05d", i), Delay: time.Duration(i) * time.Millisecond}
	}
	if _, err := ob.EnqueueMany(ctx, b.pool, tasks); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	var done []chan error
	t.Cleanup(func() {
		stop()
		for _, d := range done {
			<-d
		}
	})
	goRun := func(run func(context.Context) error) {
		d := make(chan error, 1)
		done = append(done, d)
		go func() { d <- run(runCtx) }()
	}
	rl, err := relay.New(b.pool, b.dq.AsRedis(), relay.Config{})
	if err != nil {
		t.Fatal(err)
	}
	goRun(rl.Run)
	// The second half of the tasks holds in its handlers until the pause has
	// returned: however slow the machine, the pause lands with tasks left to
	// run (at most the workers' 16 slots of them leased), not after the drain.
	paused := make(chan struct{})
	for range 2 {
		w, err := clientkit.NewClient(b.pool, b.dq, ob, delayq.WorkerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		err = w.HandleTx("load", func(ctx context.Context, tx pgx.Tx, task *delayq.Task) error {
			if task.ID >= fmt.Sprintf("t%05d", n/2) {
				select {
				case <-paused:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO runs (id) VALUES ($1)`, task.ID)
			return err
		}, delayq.QueueConfig{Concurrency: 8})
		if err != nil {
			t.Fatal(err)
		}
		goRun(w.Run)
	}
	ran := func() []string {
		rows, _ := b.pool.Query(ctx, `SELECT id FROM runs`)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("not within a minute: %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("the first runs", func() bool { return len(ran()) >= n*3/20 })

	k, _ := b.dq.Keys("load")
	b.run(t, "queue", "pause", "--prefix", b.prefix, "load").want(t, 0, "load paused")
	leased, err := b.rdb.ZRange(ctx, k.Active, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	before := ran()
	close(paused)
	// Paused: the tasks leased before the pause finish, nothing else starts.
	waitFor("the leased tasks to finish", func() bool {
		c, err := b.rdb.ZCard(ctx, k.Active).Result()
		return err == nil && c == 0
	})
	after := ran()
	allowed := map[string]bool{}
	for _, id := range append(before, leased...) {
		allowed[id] = true
	}
	for _, id := range after {
		if !allowed[id] {
			t.Fatalf("task %s ran after the pause returned, not leased before it", id)
		}
	}
	if len(after) > n/2+16 {
		t.Fatalf("%d tasks ran, of which %d while paused: more than the 16 leased", len(after), len(after)-len(before))
	}
	// The flag lost in Redis comes back from Postgres (the relay's mirror). Until
	// it does, the queue is not paused in Redis, and a worker woken by the relay's
	// next enqueue may claim (a CI run saw t00342 run then): the runs are checked
	// above, before the loss.
	if err := b.rdb.Del(ctx, k.Control).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor("the relay to restore the pause", func() bool { c, _, err := b.dq.Controls(ctx, "load"); return err == nil && c.Paused })
	b.run(t, "queue", "list", "--prefix", b.prefix).want(t, 0, "load", "yes")
	b.run(t, "stats", "--prefix", b.prefix).want(t, 0, "PAUSED")

	b.run(t, "queue", "resume", "--prefix", b.prefix, "load").want(t, 0, "load resumed")
	// Every task runs after the resume: 1,700 transactional runs, which a loaded
	// machine under the race detector takes minutes for; the wait fails when no
	// task ran for a minute, not when the whole drain takes more than one.
	for last, deadline := len(ran()), time.Now().Add(time.Minute); last < n; {
		time.Sleep(50 * time.Millisecond)
		if now := len(ran()); now > last {
			last, deadline = now, time.Now().Add(time.Minute)
		} else if time.Now().After(deadline) {
			t.Fatalf("after the resume, no task ran for a minute: %d of %d ran", now, n)
		}
	}
	var distinct, total int
	if err := b.pool.QueryRow(ctx, `SELECT count(DISTINCT id), count(*) FROM runs`).Scan(&distinct, &total); err != nil {
		t.Fatal(err)
	}
	var doneRows int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE state = 'done'`).Scan(&doneRows); err != nil {
		t.Fatal(err)
	}
	if distinct != n || total != n || doneRows != n {
		t.Fatalf("%d runs of %d tasks, %d done; want each of %d once", total, distinct, doneRows, n)
	}
	t.Logf("paused after %d runs with %d leased; %d ran while paused; all %d once", len(before), len(leased), len(after)-len(before), n)
}

func TestQueueCommandUsage(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	b.run(t, "queue", "--help").want(t, 0, "pause QUEUE", "resume QUEUE", "list")
	b.run(t, "queue", "pause", "--help").want(t, 0, "delayq queue pause")
	b.run(t, "queue").want(t, 2)
	b.run(t, "queue", "frobnicate").want(t, 2)
	b.run(t, "queue", "pause").want(t, 2)
	b.run(t, "queue", "pause", "a b").want(t, 2)
	b.run(t, "queue", "list", "--prefix", b.prefix).want(t, 0, "no queue was ever paused")
	b.run(t, "queue", "limit", "--help").want(t, 0, "delayq queue limit", "N/PERIOD", "--burst")
	b.run(t, "queue", "limit", "q").want(t, 2)
	b.run(t, "queue", "limit", "q", "fast").want(t, 2)
	b.run(t, "queue", "limit", "q", "10/s", "--burst", "-1").want(t, 2)
	b.run(t, "queue", "limit", "--prefix", b.prefix, "q", "10/s", "--burst", "4").want(t, 0, "q rate limit 10/1s burst 4")
	b.run(t, "queue", "list", "--prefix", b.prefix).want(t, 0, "10/1s", "same")
	b.run(t, "queue", "limit", "--prefix", b.prefix, "q", "none").want(t, 0, "q rate limit none")
}

// TestQueueShardsCommand sets a queue's shard count with `delayq queue shards`:
// bad input is a usage error; an empty queue takes the count (in PostgreSQL, with
// a new version, and mirrored); a queue with a pending row, or a task in Redis, is
// refused and nothing is written; the count it has already is a no-op.
func TestQueueShardsCommand(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	ctx := t.Context()
	shards := func(queue string) (n int, version int64) {
		t.Helper()
		err := b.pool.QueryRow(ctx, `SELECT shards, version FROM delayq_queues WHERE queue = $1`, queue).Scan(&n, &version)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return n, version
	}
	pre := func(args ...string) []string {
		return append([]string{"queue", "shards", "--prefix", b.prefix}, args...)
	}

	b.run(t, "queue", "--help").want(t, 0, "shards QUEUE N")
	b.run(t, "queue", "shards", "--help").want(t, 0, "delayq queue shards", "only while the queue is empty",
		"no pending, queued or dead tasks", "producers stopped", "within seconds")
	for _, bad := range [][]string{{}, {"q"}, {"q", "many"}, {"q", "0"}, {"q", "-2"}, {"q", "65"}, {"a b", "2"}, {"q", "2", "3"}} {
		r := b.run(t, pre(bad...)...)
		r.want(t, exitUsage)
		if len(bad) == 2 && bad[0] == "q" && bad[1] != "-2" { // -2 is taken for a flag
			r.oneLineErr(t, "invalid shard count")
		}
	}
	if n, _ := shards("q"); n != 0 {
		t.Fatalf("a usage error wrote %d shards", n)
	}

	// Empty: set, mirrored with the version PostgreSQL gave it.
	b.run(t, pre("mail", "4")...).want(t, exitOK, "mail shards 4")
	n, v := shards("mail")
	if n != 4 || v != 1 {
		t.Fatalf("mail: %d shards, version %d; want 4, 1", n, v)
	}
	if rc, rv, err := b.dq.Controls(ctx, "mail"); err != nil || rv != v || rc.Shards != 4 {
		t.Fatalf("Redis holds %+v version %d (%v), want 4 shards, version %d", rc, rv, err, v)
	}
	b.run(t, "queue", "pause", "--prefix", b.prefix, "mail").want(t, exitOK, "mail paused")
	if n, _ := shards("mail"); n != 4 {
		t.Fatalf("a pause changed the count to %d", n)
	}
	if rc, _, err := b.dq.Controls(ctx, "mail"); err != nil || rc.Shards != 4 || !rc.Paused {
		t.Fatalf("after the pause Redis holds %+v (%v), want 4 shards, paused", rc, err)
	}
	b.run(t, "queue", "list", "--prefix", b.prefix).want(t, exitOK, "SHARDS", "mail", "same")
	r := b.run(t, "queue", "list", "--prefix", b.prefix, "--json")
	r.want(t, exitOK)
	var rows []queueRow
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || len(rows) != 1 || rows[0].Shards != 4 || !rows[0].Paused {
		t.Fatalf("list --json: %+v, %v\n%s", rows, err, r.stdout)
	}

	// A pending row: refused, nothing written in either store; the same count is
	// still a success.
	b.run(t, "enqueue", "--queue", "mail", "--id", "m-1", "--delay", "1h").want(t, exitOK, "enqueued mail/m-1")
	_, v = shards("mail")
	r = b.run(t, pre("mail", "8")...)
	r.want(t, exitFailure)
	r.oneLineErr(t, "mail is not empty: PostgreSQL holds pending, queued or dead tasks")
	if n, v2 := shards("mail"); n != 4 || v2 != v {
		t.Fatalf("a refused change wrote: %d shards, version %d; want 4, %d", n, v2, v)
	}
	if _, rv, _ := b.dq.Controls(ctx, "mail"); rv != v {
		t.Fatalf("a refused change reached Redis: version %d, want %d", rv, v)
	}
	b.run(t, pre("mail", "4")...).want(t, exitOK, "mail shards 4")
	if n, v2 := shards("mail"); n != 4 || v2 != v {
		t.Fatalf("the same count changed the row: %d shards, version %d; want 4, %d", n, v2, v)
	}

	// A task in Redis only (enqueued there directly: no row): refused too.
	if _, err := b.dq.Enqueue(ctx, "direct", dispatch.Task{ID: "d-1", RunAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	r = b.run(t, pre("direct", "2")...)
	r.want(t, exitFailure)
	r.oneLineErr(t, "Redis holds 1 of its tasks (1 ready, 0 active, 0 dead)")
	if n, _ := shards("direct"); n != 0 {
		t.Fatalf("a refused change wrote %d shards", n)
	}

	// Once the task is done, the queue is empty: back to 1 shard.
	b.exec(t, `UPDATE delayq_outbox SET state = 'done', done_at = now() WHERE queue = 'mail'`)
	b.run(t, pre("mail", "1")...).want(t, exitOK, "mail shards 1")
	if n, v2 := shards("mail"); n != 1 || v2 != v+1 {
		t.Fatalf("mail: %d shards, version %d; want 1, %d", n, v2, v+1)
	}
}

// TestQueueKeysCommand sets a queue's limits per concurrency key with `delayq
// queue keys`: bad input is a usage error that writes nothing; the limits are
// committed, mirrored and listed; none lifts the throttle.
func TestQueueKeysCommand(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	ctx := t.Context()
	pre := func(args ...string) []string { return append([]string{"queue", "keys", "--prefix", b.prefix}, args...) }
	b.run(t, "queue", "--help").want(t, 0, "keys QUEUE")
	b.run(t, "queue", "keys", "--help").want(t, 0, "delayq queue keys", "--concurrency", "--throttle", "N/PERIOD")
	for _, bad := range [][]string{{}, {"--concurrency", "-1", "q"}, {"--concurrency", "100001", "q"},
		{"--throttle", "fast", "q"}, {"--throttle", "10001/1s", "q"}, {"a b"}} {
		b.run(t, pre(bad...)...).want(t, exitUsage)
	}
	b.run(t, pre("--concurrency", "2", "--throttle", "10/1m", "mail")...).want(t, exitOK, "mail keys: concurrency 2, throttle 10/1m0s")
	rc, _, err := b.dq.Controls(ctx, "mail")
	if err != nil || rc.KeyConcurrency != 2 || rc.KeyThrottle != 10 || rc.KeyWindow != time.Minute {
		t.Fatalf("Redis holds %+v (%v)", rc, err)
	}
	b.run(t, "queue", "list", "--json", "--prefix", b.prefix).want(t, exitOK, `"key_concurrency": 2`, `"key_throttle": "10/1m0s"`)
	b.run(t, pre("--concurrency", "1", "mail")...).want(t, exitOK, "mail keys: concurrency 1, throttle none")
	if rc, _, _ := b.dq.Controls(ctx, "mail"); rc.KeyConcurrency != 1 || rc.KeyThrottle != 0 {
		t.Fatalf("Redis holds %+v", rc)
	}
}
