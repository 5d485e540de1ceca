package delayq

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
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
