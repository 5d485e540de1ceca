package delayq

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// TestRunRefusesAnUnmigratedSchema: a worker on a database whose migrations have
// not run stops at once with outbox.ErrNotMigrated and the hint, instead of
// running and failing every completion.
func TestRunRefusesAnUnmigratedSchema(t *testing.T) {
	t.Parallel()
	b := setup(t) // its Redis and outbox Client; the pool below is an empty database
	pool := testenv.Pool(t, testenv.EmptyPostgresURL(t))
	w, err := newWorker(pool, b.dq, b.ob, WorkerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Handle("q", func(context.Context, *Task) error { return nil }, QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = w.Run(ctx)
	if !errors.Is(err, outbox.ErrNotMigrated) || !strings.Contains(err.Error(), "delayq migrate up") {
		t.Fatalf("Run on an unmigrated database: %v, want outbox.ErrNotMigrated with the hint", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run waited for its context instead of refusing at once")
	}
}

// TestCallsOnAnUnmigratedSchema: every call a user makes on a database whose
// migrations have not run returns an error wrapping outbox.ErrNotMigrated that
// names the missing table and ends with the hint, not PostgreSQL's raw 42P01;
// an enqueue in the user's transaction writes nothing and leaves the
// transaction aborted, as any failed statement does.
func TestCallsOnAnUnmigratedSchema(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	emptyURL := testenv.EmptyPostgresURL(t)
	pool := testenv.Pool(t, emptyURL)
	c, err := New(pool, rdb, Config{Prefix: prefix, Relay: &relay.Config{}})
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, err := sql.Open("pgx", emptyURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sqlDB.Close() })
	ob := c.Outbox()
	task := outbox.Task{Queue: "q", ID: "x"}
	typed := outbox.Queue[struct{ N int }]{Name: "typed"}
	// In the user's own transaction: the error, and the transaction aborted.
	inTx := func(ctx context.Context, f func(pgx.Tx) error) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // the transaction is aborted
		if err := f(tx); err == nil {
			return errors.New("no error")
		} else if _, err2 := tx.Exec(ctx, `SELECT 1`); err2 == nil {
			return fmt.Errorf("the transaction is still usable after %w", err)
		} else {
			return err
		}
	}
	for _, c2 := range []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"outbox Enqueue", func(ctx context.Context) error { _, err := ob.Enqueue(ctx, pool, task); return err }},
		{"outbox Enqueue in a tx", func(ctx context.Context) error {
			return inTx(ctx, func(tx pgx.Tx) error { _, err := ob.Enqueue(ctx, tx, task); return err })
		}},
		{"outbox EnqueueSQL", func(ctx context.Context) error { _, err := ob.EnqueueSQL(ctx, sqlDB, task); return err }},
		{"outbox EnqueueMany", func(ctx context.Context) error {
			_, err := ob.EnqueueMany(ctx, pool, []outbox.Task{task, {Queue: "q", ID: "y"}})
			return err
		}},
		{"outbox EnqueueManySQL", func(ctx context.Context) error {
			_, err := ob.EnqueueManySQL(ctx, sqlDB, []outbox.Task{task})
			return err
		}},
		{"typed Queue.Enqueue", func(ctx context.Context) error {
			_, err := typed.Enqueue(ctx, c, pool, outbox.Task{ID: "x"}, struct{ N int }{1})
			return err
		}},
		{"typed Queue.EnqueueSQL", func(ctx context.Context) error {
			_, err := typed.EnqueueSQL(ctx, c, sqlDB, outbox.Task{ID: "x"}, struct{ N int }{1})
			return err
		}},
		{"outbox Cancel", func(ctx context.Context) error { return ob.Cancel(ctx, pool, "q", "x") }},
		{"outbox Reschedule", func(ctx context.Context) error { return ob.Reschedule(ctx, pool, "q", "x", time.Now().Add(time.Hour)) }},
		{"outbox RetryDeadEdited", func(ctx context.Context) error {
			_, err := ob.RetryDeadEdited(ctx, pool, "q", "x", 1, []byte("{}"))
			return err
		}},
		{"outbox CheckMigrated", func(ctx context.Context) error { return ob.CheckMigrated(ctx, pool) }},
		{"Stats", func(ctx context.Context) error { _, err := c.Stats(ctx); return err }},
		{"Queues", func(ctx context.Context) error { _, err := c.Queues(ctx); return err }},
		{"Pause", func(ctx context.Context) error { _, err := c.Pause(ctx, "q"); return err }},
		{"Resume", func(ctx context.Context) error { _, err := c.Resume(ctx, "q"); return err }},
		{"SetRateLimit", func(ctx context.Context) error {
			_, err := c.SetRateLimit(ctx, "q", delayqtype.RateLimit{Limit: 1, Period: time.Second})
			return err
		}},
		{"SetShards", func(ctx context.Context) error { _, err := c.SetShards(ctx, "q", 2); return err }},
		{"DeadTasks", func(ctx context.Context) error { _, err := c.DeadTasks(ctx, 10); return err }},
		{"RetryDead", func(ctx context.Context) error { return c.RetryDead(ctx, "q", "x") }},
		{"RetryDeadEdited", func(ctx context.Context) error { return c.RetryDeadEdited(ctx, "q", "x", 1, []byte("{}")) }},
		{"PurgeDead", func(ctx context.Context) error { _, err := c.PurgeDead(ctx); return err }},
		{"Cancel", func(ctx context.Context) error { return c.Cancel(ctx, "q", "x") }},
		{"Reschedule", func(ctx context.Context) error { return c.Reschedule(ctx, "q", "x", time.Now().Add(time.Hour)) }},
		{"Check", func(ctx context.Context) error { _, err := c.Check(ctx); return err }},
		{"Reconcile", func(ctx context.Context) error { _, err := c.Reconcile(ctx); return err }},
		{"Schedules", func(ctx context.Context) error { _, err := c.Schedules(ctx); return err }},
	} {
		err := c2.call(ctxT(t, 10*time.Second))
		msg := fmt.Sprint(err)
		if !errors.Is(err, outbox.ErrNotMigrated) || !strings.HasSuffix(msg, "not found (run the migrations: delayq migrate up)") ||
			!strings.Contains(msg, "delayq_") || strings.Contains(msg, "SQLSTATE") {
			t.Errorf("%s: %v\nwant outbox.ErrNotMigrated naming the table and ending with the hint", c2.name, err)
		}
	}
	// Run, with a handler and the relay: one error, not the worker's and the
	// relay's each.
	if err := c.Handle("q", func(context.Context, *Task) error { return nil }, QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Run(ctxT(t, 10*time.Second)); !errors.Is(err, outbox.ErrNotMigrated) || strings.Count(err.Error(), "delayq migrate up") != 1 {
		t.Errorf("Run: %v, want one outbox.ErrNotMigrated", err)
	}
}
