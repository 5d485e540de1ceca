package delayq

import (
	"context"
	"slices"
	"testing"
	"time"
)

// A running worker registers the queues it serves in Redis's queue registry, so
// that the dashboard and delayq stats list a queue before its first task.
func TestRunRegistersItsQueues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, WorkerConfig{}, func(w *worker) {
		none := func(context.Context, *Task) error { return nil }
		_ = w.Handle("invoices", none, QueueConfig{})
		_ = w.Handle("receipts", none, QueueConfig{})
	})
	ctx := ctxT(t, 10*time.Second)
	for {
		qs, err := b.dq.RegisteredQueues(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(qs, []string{"invoices", "receipts"}) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("registered queues %q, want invoices and receipts", qs)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
