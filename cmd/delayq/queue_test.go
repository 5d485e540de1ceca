package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq/worker"
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
	const n = 2000
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
	rl, err := relay.New(b.pool, b.dq, relay.Config{})
	if err != nil {
		t.Fatal(err)
	}
	goRun(rl.Run)
	for range 2 {
		w, err := worker.New(b.pool, b.dq, ob, worker.Config{})
		if err != nil {
			t.Fatal(err)
		}
		err = w.HandleTx("load", func(ctx context.Context, tx pgx.Tx, task *worker.Task) error {
			_, err := tx.Exec(ctx, `INSERT INTO runs (id) VALUES ($1)`, task.ID)
			return err
		}, worker.QueueConfig{Concurrency: 8})
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
	waitFor("300 runs", func() bool { return len(ran()) >= 300 })

	k, _ := b.dq.Keys("load")
	b.run(t, "queue", "pause", "--prefix", b.prefix, "load").want(t, 0, "load paused")
	leased, err := b.rdb.ZRange(ctx, k.Active, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	before := ran()
	// Paused: the tasks leased before the pause finish, nothing else starts.
	waitFor("the leased tasks to finish", func() bool {
		c, err := b.rdb.ZCard(ctx, k.Active).Result()
		return err == nil && c == 0
	})
	// The flag lost in Redis comes back from Postgres (the relay's mirror).
	if err := b.rdb.Del(ctx, k.Control).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor("the relay to restore the pause", func() bool { c, _, err := b.dq.Controls(ctx, "load"); return err == nil && c.Paused })
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
	if len(after) >= n {
		t.Fatalf("every task ran while paused")
	}
	b.run(t, "queue", "list", "--prefix", b.prefix).want(t, 0, "load", "yes")
	b.run(t, "stats", "--prefix", b.prefix).want(t, 0, "PAUSED")

	b.run(t, "queue", "resume", "--prefix", b.prefix, "load").want(t, 0, "load resumed")
	waitFor("every task to run", func() bool { return len(ran()) >= n })
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
