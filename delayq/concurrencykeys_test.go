package delayq

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/outbox"
)

// With a cap of 2 runs per key and four workers of 8 slots each, no instant has
// more than 2 runs of one key (each handler counts its key's runs with an
// atomic), the keys reach their cap, and every task, keyed or not, runs once.
func TestKeyCapAcrossWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, 2*time.Minute)
	ctl, err := queuectl.New(b.pool, b.dq, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.SetKeyLimits(ctx, "tenants", 2, 0, 0); err != nil {
		t.Fatal(err)
	}
	const keys, perKey, unkeyed, workers = 4, 15, 20, 4
	const n = keys*perKey + unkeyed
	var (
		mu       sync.Mutex
		running  = map[string]*atomic.Int64{}
		peak     = map[string]int64{}
		finished atomic.Int64
		all      = make(chan struct{})
	)
	for k := range keys {
		running[fmt.Sprintf("k%d", k)] = new(atomic.Int64)
	}
	hs := make([]*harness, workers)
	for i := range hs {
		hs[i] = b.startOn(t, b.pool, WorkerConfig{}, func(w *worker) {
			w.hooks.finished = func(*Task, outcome) {
				if finished.Add(1) == n {
					close(all)
				}
			}
			if err := w.HandleTx("tenants", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
				key := string(tk.Payload)
				if c := running[key]; c != nil {
					now := c.Add(1)
					defer c.Add(-1)
					mu.Lock()
					peak[key] = max(peak[key], now)
					mu.Unlock()
					time.Sleep(3 * time.Millisecond) // work, so that runs of a key overlap
				}
				return insertEffect(ctx, tx, tk, "w")
			}, QueueConfig{Concurrency: 8}); err != nil {
				t.Fatal(err)
			}
		})
	}
	var tasks []outbox.Task
	for i := range perKey {
		for k := range keys {
			key := fmt.Sprintf("k%d", k)
			tasks = append(tasks, outbox.Task{Queue: "tenants", ID: fmt.Sprintf("%s-%02d", key, i), Payload: []byte(key), ConcurrencyKey: key})
		}
	}
	for i := range unkeyed {
		tasks = append(tasks, outbox.Task{Queue: "tenants", ID: fmt.Sprintf("free-%02d", i), Payload: []byte("free")})
	}
	b.enqueue(t, tasks...)
	select {
	case <-all:
	case <-ctx.Done():
		t.Fatalf("only %d of %d runs finished", finished.Load(), n)
	}
	for _, h := range hs {
		h.stop()
	}
	mu.Lock()
	defer mu.Unlock()
	for key, p := range peak {
		if p > 2 {
			t.Errorf("key %s: %d runs at once, cap 2", key, p)
		}
		if p < 2 {
			t.Logf("key %s never reached its cap (peak %d)", key, p)
		}
	}
	if len(peak) != keys {
		t.Errorf("%d keys ran, want %d", len(peak), keys)
	}
	if got := b.count(t, `SELECT count(DISTINCT task_id) FROM effects`); got != n {
		t.Errorf("%d tasks with effects, want %d", got, n)
	}
	st, err := b.dq.Stats(ctx, "tenants")
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 0 || st.Active != 0 {
		t.Errorf("Redis still holds tasks: %+v", st)
	}
}
