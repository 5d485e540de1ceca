package outbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// A task's priority is stored by every enqueue path (one task, many with the
// priorities padded after leading zeros, many without any, database/sql, the typed
// API) and kept by a reschedule; one outside 0..9 is refused with
// ErrInvalidPriority and writes nothing, and the table's CHECK refuses it too.
func TestPriorityStored(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	priority := func(id string) int {
		t.Helper()
		var p int
		if err := b.pool.QueryRow(ctx, `SELECT priority FROM delayq_outbox WHERE queue = 'p' AND task_id = $1`, id).Scan(&p); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		return p
	}
	if _, err := b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "p", ID: "one", Priority: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.EnqueueSQL(ctx, b.sqlDB(t), outbox.Task{Queue: "p", ID: "sql", Priority: 9}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.EnqueueMany(ctx, b.pool, []outbox.Task{
		{Queue: "p", ID: "m0"}, {Queue: "p", ID: "m1"}, {Queue: "p", ID: "m2", Priority: 5}, {Queue: "p", ID: "m3"}, {Queue: "p", ID: "m4", Priority: 1},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.EnqueueMany(ctx, b.pool, []outbox.Task{{Queue: "p", ID: "z0"}, {Queue: "p", ID: "z1"}}); err != nil {
		t.Fatal(err)
	}
	q := outbox.Queue[int]{Name: "p"}
	typed, err := q.Task(outbox.Task{ID: "typed", Priority: 7, Delay: time.Hour}, 42)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.Enqueue(ctx, b.pool, typed); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"one": 3, "sql": 9, "m0": 0, "m1": 0, "m2": 5, "m3": 0, "m4": 1, "z0": 0, "z1": 0, "typed": 7}
	for id, p := range want {
		if got := priority(id); got != p {
			t.Errorf("%s: priority %d, want %d", id, got, p)
		}
	}
	if err := b.client.Reschedule(ctx, b.pool, "p", "typed", time.Now().Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := priority("typed"); got != 7 {
		t.Errorf("rescheduled: priority %d, want 7", got)
	}

	for _, p := range []int{-1, 10, 1 << 20} {
		task := outbox.Task{Queue: "p", ID: "bad", Priority: p}
		if err := b.client.Validate(task); !errors.Is(err, validate.ErrInvalidPriority) {
			t.Errorf("Validate priority %d: %v", p, err)
		}
		if _, err := b.client.Enqueue(ctx, b.pool, task); !errors.Is(err, validate.ErrInvalidPriority) {
			t.Errorf("Enqueue priority %d: %v", p, err)
		}
		if _, err := b.client.EnqueueMany(ctx, b.pool, []outbox.Task{{Queue: "p", ID: "fine"}, task}); !errors.Is(err, validate.ErrInvalidPriority) {
			t.Errorf("EnqueueMany priority %d: %v", p, err)
		}
	}
	if n := count(t, b.pool, "task_id IN ('bad', 'fine')"); n != 0 {
		t.Errorf("%d rows written by refused enqueues", n)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, priority)
		VALUES ('p', 'by-hand', now(), '', 25, 10)`); err == nil {
		t.Error("the table took priority 10")
	}
}
