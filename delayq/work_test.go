package delayq

import (
	"context"
	"errors"
	"testing"
)

// Work runs one due task synchronously; it refuses an unknown queue and a
// running worker, and reports no task when none is due.
func TestWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w, err := newWorker(b.pool, b.dq, b.ob, WorkerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	_ = w.Handle("q", func(context.Context, *Task) error { ran++; return nil }, QueueConfig{})
	if res, err := w.Work(ctx, "q"); err != nil || res.Task != nil {
		t.Errorf("nothing due: %+v %v", res, err)
	}
	if _, err := w.Work(ctx, "other"); !errors.Is(err, ErrInvalidQueue) {
		t.Errorf("unknown queue: %v", err)
	}
	b.enqueue(t, task("q", "a"))
	res, err := w.Work(ctx, "q")
	if err != nil || res.Task == nil || res.Task.ID != "a" || res.Outcome != OutcomeSucceeded || ran != 1 {
		t.Fatalf("work: %+v %v (ran %d)", res, err, ran)
	}
	if r := b.row(t, "q", "a"); r.state != "done" {
		t.Errorf("row %+v", r)
	}
	w.mu.Lock()
	w.running = true
	w.mu.Unlock()
	if _, err := w.Work(ctx, "q"); !errors.Is(err, ErrRunning) {
		t.Errorf("while running: %v", err)
	}
}
