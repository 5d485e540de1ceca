package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// TestStartByCheckedAgainstTheDueTime: a start deadline before the task's due
// time (now plus its delay, its run-at, or now for a run-at in the past) is refused
// with ErrInvalidStartBy by Enqueue, EnqueueSQL and EnqueueMany, nothing is
// written, and the caller's transaction goes on; a deadline at or after the due
// time is stored, and a task whose key exists is a duplicate whatever its deadline. Before the check in the statement, the delay and past cases were
// accepted and the task died unrun.
func TestStartByCheckedAgainstTheDueTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := time.Now()
	refused := []struct {
		name string
		task outbox.Task
		says string
	}{
		{"deadline before now plus the delay", outbox.Task{Delay: 4 * time.Second, StartBy: now.Add(2 * time.Second)}, "before the task's due time"},
		{"deadline in the past", outbox.Task{StartBy: now.Add(-time.Minute)}, "before the task's due time"},
		{"deadline past, after a past run-at", outbox.Task{RunAt: now.Add(-time.Hour), StartBy: now.Add(-time.Minute)}, "before the task's due time"},
		{"deadline before the run-at", outbox.Task{RunAt: now.Add(time.Hour), StartBy: now.Add(time.Minute)}, "before RunAt"},
		{"deadline at the epoch", outbox.Task{StartBy: time.Unix(0, 0)}, "out of range"},
	}
	rows := func(queue string) int {
		var n int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE queue = $1`, queue).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	db := b.sqlDB(t)
	for i, c := range refused {
		q := fmt.Sprintf("late-%d", i)
		c.task.Queue, c.task.ID = q, "x"
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.client.Enqueue(ctx, tx, c.task); !errors.Is(err, validate.ErrInvalidStartBy) {
			t.Errorf("%s: Enqueue: %v, want ErrInvalidStartBy", c.name, err)
		} else if !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: Enqueue: %q does not say %q", c.name, err, c.says)
		}
		ok := c.task
		ok.ID, ok.StartBy = "ok", time.Time{}
		many := []outbox.Task{ok, c.task}
		if _, err := b.client.EnqueueMany(ctx, tx, many); !errors.Is(err, validate.ErrInvalidStartBy) || !strings.Contains(err.Error(), "task 1 of 2") {
			t.Errorf("%s: EnqueueMany: %v, want ErrInvalidStartBy naming task 1 of 2", c.name, err)
		}
		// The transaction is still usable, and commits nothing of the above.
		after := outbox.Task{Queue: q, ID: "after"}
		if _, err := b.client.Enqueue(ctx, tx, after); err != nil {
			t.Fatalf("%s: the transaction after the refusal: %v", c.name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if n := rows(q); n != 1 {
			t.Errorf("%s: %d rows in queue %s, want only the task enqueued after the refusals", c.name, n, q)
		}
		// database/sql too.
		sqlTx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.client.EnqueueSQL(ctx, sqlTx, c.task); !errors.Is(err, validate.ErrInvalidStartBy) {
			t.Errorf("%s: EnqueueSQL: %v, want ErrInvalidStartBy", c.name, err)
		}
		if err := sqlTx.Commit(); err != nil {
			t.Fatal(err)
		}
		if n := rows(q); n != 1 {
			t.Errorf("%s: EnqueueSQL wrote a row", c.name)
		}
	}

	// Accepted: a deadline after the due time, and one exactly at a run-at.
	runAt := now.Add(time.Hour).Truncate(time.Millisecond)
	for i, task := range []outbox.Task{
		{Delay: 4 * time.Second, StartBy: now.Add(time.Hour)},
		{RunAt: runAt, StartBy: runAt},
	} {
		task.Queue, task.ID = "fine", fmt.Sprint(i)
		res, err := b.client.Enqueue(ctx, b.pool, task)
		if err != nil || res.Duplicate {
			t.Fatalf("%+v: %+v, %v", task, res, err)
		}
		var sb time.Time
		if err := b.pool.QueryRow(ctx, `SELECT start_by FROM delayq_outbox WHERE queue = 'fine' AND task_id = $1`, task.ID).Scan(&sb); err != nil {
			t.Fatal(err)
		}
		if !sb.Equal(task.StartBy.Truncate(time.Microsecond)) {
			t.Fatalf("start_by %v, want %v", sb, task.StartBy)
		}
	}
	mr, err := b.client.EnqueueMany(ctx, b.pool, []outbox.Task{
		{Queue: "fine", ID: "m1", Delay: time.Second, StartBy: now.Add(time.Minute)},
		{Queue: "fine", ID: "m2"},
	})
	if err != nil || mr.Inserted != 2 {
		t.Fatalf("EnqueueMany: %+v, %v", mr, err)
	}
	// A key that exists is a duplicate, whatever its deadline: a producer retrying
	// after its deadline passed finds its task enqueued.
	past := outbox.Task{Queue: "fine", ID: "0", StartBy: now.Add(-time.Minute)}
	if res, err := b.client.Enqueue(ctx, b.pool, past); err != nil || !res.Duplicate {
		t.Fatalf("a retry past its deadline: %+v, %v; want a duplicate", res, err)
	}
	mr, err = b.client.EnqueueMany(ctx, b.pool, []outbox.Task{past, {Queue: "fine", ID: "m3"}})
	if err != nil || mr.Inserted != 1 || mr.Duplicates != 1 {
		t.Fatalf("EnqueueMany with a retry past its deadline: %+v, %v", mr, err)
	}
}

// TestRescheduleCheckedAgainstTheStartBy: a reschedule to a time after the task's
// start deadline is refused with ErrInvalidStartBy and changes nothing (the task
// would have died unrun at its first claim); one before the deadline moves it,
// and a task without a deadline moves anywhere.
func TestRescheduleCheckedAgainstTheStartBy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := time.Now()
	deadline := now.Add(time.Hour)
	for _, task := range []outbox.Task{
		{Queue: "q", ID: "bounded", Delay: time.Minute, StartBy: deadline},
		{Queue: "q", ID: "free", Delay: time.Minute},
	} {
		if _, err := b.client.Enqueue(ctx, b.pool, task); err != nil {
			t.Fatal(err)
		}
	}
	row := func(id string) (version int, runAt time.Time) {
		if err := b.pool.QueryRow(ctx, `SELECT version, run_at FROM delayq_outbox WHERE queue = 'q' AND task_id = $1`, id).Scan(&version, &runAt); err != nil {
			t.Fatal(err)
		}
		return version, runAt
	}
	v0, at0 := row("bounded")
	err := b.client.Reschedule(ctx, b.pool, "q", "bounded", deadline.Add(time.Minute))
	if !errors.Is(err, validate.ErrInvalidStartBy) || !strings.Contains(err.Error(), "could never start") {
		t.Fatalf("reschedule past the deadline: %v, want ErrInvalidStartBy", err)
	}
	if v, at := row("bounded"); v != v0 || !at.Equal(at0) {
		t.Errorf("refused reschedule changed the row: version %d run_at %v, was %d %v", v, at, v0, at0)
	}
	if err := b.client.Reschedule(ctx, b.pool, "q", "bounded", deadline.Add(-time.Minute)); err != nil {
		t.Fatalf("reschedule before the deadline: %v", err)
	}
	if v, _ := row("bounded"); v != v0+1 {
		t.Errorf("version %d after a reschedule, want %d", v, v0+1)
	}
	if err := b.client.Reschedule(ctx, b.pool, "q", "free", deadline.Add(time.Hour)); err != nil {
		t.Fatalf("reschedule of a task without a deadline: %v", err)
	}
	// Gone and finished tasks still say so.
	if err := b.client.Reschedule(ctx, b.pool, "q", "nobody", now); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("reschedule of a missing task: %v, want ErrNotFound", err)
	}
}
