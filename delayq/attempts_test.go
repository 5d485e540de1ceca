package delayq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
)

func (b *bundle) attempts(t *testing.T, queue, id string) []delayqtype.Attempt {
	t.Helper()
	row, ok, err := taskstate.NewBrowser(taskstate.Config{Schema: "public"}).Task(context.Background(), b.pool, queue, id, 0)
	if err != nil || !ok {
		t.Fatalf("task %s/%s: %v %v", queue, id, ok, err)
	}
	return row.Attempts
}

// deepPanic panics from depth frames down, for a stack longer than the bound.
func deepPanic(depth int) {
	if depth == 0 {
		panic("deep kaboom")
	}
	deepPanic(depth - 1)
}

// A task that fails (an error), then panics, then succeeds has each run in its
// history: the two failures with their errors, the panic with its stack (from
// the panicking frame, cut at MaxStackBytes), then the success.
func TestAttemptHistoryOfRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.Handle("a", func(ctx context.Context, tk *Task) error {
			switch tk.Attempt {
			case 1:
				return errors.New("boom 1: " + strings.Repeat("x", 3000))
			case 2:
				deepPanic(500)
			}
			return nil
		}, QueueConfig{Backoff: Backoff{Base: time.Millisecond, Max: time.Millisecond}})
	})
	b.enqueue(t, task("a", "x"))
	h.expect(t, "x", outRetried)
	h.expect(t, "x", outRetried)
	h.expect(t, "x", outSucceeded)
	got := b.attempts(t, "a", "x")
	if len(got) != 3 {
		t.Fatalf("history %+v, want 3 runs", got)
	}
	var outs []string
	for _, a := range got {
		outs = append(outs, fmt.Sprintf("%d/%d %s", a.Version, a.Attempt, a.Outcome))
	}
	if s := strings.Join(outs, ", "); s != "1/1 retried, 1/2 retried, 1/3 succeeded" {
		t.Errorf("history %s", s)
	}
	if e := got[0].Error; !strings.HasPrefix(e, "boom 1: xxx") || len(e) > validate.MaxAttemptErrorBytes || len(e) < validate.MaxErrorBytes || got[0].Stack != "" {
		t.Errorf("first run: error of %d bytes %.20q, stack %q", len(e), e, got[0].Stack)
	}
	if got[1].Error != "panic: deep kaboom" {
		t.Errorf("panic's error %q", got[1].Error)
	}
	// From the panicking frame on: the recovery's frames are left out.
	if s := got[1].Stack; len(s) > validate.MaxStackBytes || len(s) < validate.MaxStackBytes-8 ||
		!strings.HasPrefix(s, "goroutine ") || !strings.Contains(strings.SplitN(s, "\n", 3)[1], "deepPanic") ||
		strings.Contains(s, "debug.Stack") || !strings.HasSuffix(s, "…") {
		t.Errorf("panic's stack: %d bytes, want cut at %d:\n%.300s", len(s), validate.MaxStackBytes, s)
	}
	if got[2].Error != "" || got[2].Stack != "" || got[2].At.Before(got[1].At) {
		t.Errorf("success %+v after %v", got[2], got[1].At)
	}
}

// A death with the queue's OnDead hook (in the death's transaction) is in the
// history; so is a handler's cancellation.
func TestAttemptHistoryDeadAndCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.Handle("d", func(ctx context.Context, tk *Task) error {
			return fmt.Errorf("fail %d", tk.Attempt)
		}, QueueConfig{Backoff: Backoff{Base: time.Millisecond, Max: time.Millisecond},
			OnDead: func(context.Context, pgx.Tx, *Task, error) error { return nil }})
		_ = w.Handle("c", func(ctx context.Context, tk *Task) error {
			return Cancel(errors.New("order deleted"))
		}, QueueConfig{})
	})
	dt := task("d", "x")
	dt.MaxAttempts = 2
	b.enqueue(t, dt)
	h.expect(t, "x", outRetried)
	h.expect(t, "x", outDead)
	b.enqueue(t, task("c", "y"))
	h.expect(t, "y", outCancelled)
	var outs []string
	for _, a := range b.attempts(t, "d", "x") {
		outs = append(outs, fmt.Sprintf("%d %s %s", a.Attempt, a.Outcome, a.Error))
	}
	if s := strings.Join(outs, ", "); s != "1 retried fail 1, 2 dead fail 2" {
		t.Errorf("dead task's history: %s", s)
	}
	if got := b.attempts(t, "c", "y"); len(got) != 1 || got[0].Outcome != "cancelled" || !strings.Contains(got[0].Error, "order deleted") {
		t.Errorf("cancelled task's history: %+v", got)
	}
}
