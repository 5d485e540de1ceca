package delayq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// A queued task replaced before it is due runs once, with the new payload, at
// the new time and never at the old one: end to end through the relay (which
// replaces the copy in Redis, as after a reschedule) and the worker.
func TestReplacedQueuedTaskRunsOnceWithTheNewPayload(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := testenv.Postgres(t)
	rdb, prefix := testenv.Redis(t)
	client, err := delayq.New(pool, rdb, delayq.Config{Prefix: prefix,
		Relay: &relay.Config{PollInterval: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	type run struct {
		order   string
		version int
		at      time.Time
	}
	ran := make(chan run, 10)
	err = delayq.RegisterTx(client, payments, func(ctx context.Context, tx pgx.Tx, tk *delayq.Task, p payment) error {
		ran <- run{p.Order, tk.Version, time.Now()}
		return nil
	}, delayq.QueueConfig{})
	if err != nil {
		t.Fatal(err)
	}
	oldAt := time.Now().Add(2 * time.Second)
	if _, err := payments.Enqueue(ctx, client, pool, outbox.Task{ID: "x", RunAt: oldAt}, payment{Order: "old"}); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- client.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	state := func() (st string, version int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT state, version FROM delayq_outbox WHERE task_id = 'x'`).Scan(&st, &version); err != nil {
			t.Fatal(err)
		}
		return st, version
	}
	for st, _ := state(); st != "queued"; st, _ = state() {
		select {
		case <-ctx.Done():
			t.Fatalf("the relay never queued the task: %s", st)
		case r := <-ran:
			t.Fatalf("ran %+v before the replace", r)
		case <-time.After(20 * time.Millisecond):
		}
	}
	newAt := oldAt.Add(1500 * time.Millisecond)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	res, err := payments.Enqueue(ctx, client, tx, outbox.Task{ID: "x", RunAt: newAt, Replace: true}, payment{Order: "new"})
	if err != nil || !res.Replaced || !res.RunAt.Equal(newAt.Truncate(time.Microsecond)) {
		t.Fatalf("replace: %+v, %v", res, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ran:
		if r.order != "new" || r.version != 2 || r.at.Before(newAt) {
			t.Fatalf("ran %+v, want the new payload, version 2, not before %v", r, newAt)
		}
	case <-ctx.Done():
		t.Fatal("the replaced task never ran")
	}
	for st, _ := state(); st != "done"; st, _ = state() {
		select {
		case <-ctx.Done():
			t.Fatalf("the task never completed: %s", st)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if st, v := state(); v != 2 {
		t.Errorf("row %s at version %d, want done at version 2", st, v)
	}
	select {
	case r := <-ran:
		t.Errorf("ran again: %+v", r)
	default:
	}
	if info, err := client.Outbox().Enqueue(ctx, pool, outbox.Task{Queue: payments.Name, ID: "x", Replace: true}); err != nil || !info.Duplicate {
		t.Errorf("replace of the done task: %+v, %v; want a duplicate", info, fmt.Sprint(err))
	}
}
