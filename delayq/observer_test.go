package delayq

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// obsRecorder is an Observer that keeps what it saw.
type obsRecorder struct {
	mu     sync.Mutex
	claims []ClaimEvent
	starts []string
	ends   map[string]RunEndEvent
}

type obsCtxKey struct{}

func (r *obsRecorder) Claim(_ context.Context, e ClaimEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.claims = append(r.claims, e)
}

func (r *obsRecorder) RunStart(ctx context.Context, t *Task) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts = append(r.starts, t.ID)
	return context.WithValue(ctx, obsCtxKey{}, "run "+t.ID)
}

func (r *obsRecorder) RunEnd(ctx context.Context, t *Task, e RunEndEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx.Value(obsCtxKey{}) != "run "+t.ID {
		e.Outcome = "RunEnd without RunStart's context"
	}
	r.ends[t.ID] = e
}

// The Observer sees every claim and every run, once, with its outcome and error,
// the handler runs with the context RunStart returned, and the Prometheus observer
// (Config.Registerer) counts beside it.
func TestObserver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &obsRecorder{ends: map[string]RunEndEvent{}}
	reg := prometheus.NewRegistry()
	boom := errors.New("boom")
	h := b.start(t, WorkerConfig{Observer: rec, Registerer: reg}, func(w *worker) {
		_ = w.HandleTx("obs", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if ctx.Value(obsCtxKey{}) != "run "+tk.ID {
				return NoRetry(errors.New("handler without RunStart's context"))
			}
			switch tk.ID {
			case "dead":
				return NoRetry(boom)
			case "retry":
				if tk.Attempt == 1 {
					return RetryAfter(1, boom)
				}
			}
			return insertEffect(ctx, tx, tk, "w")
		}, QueueConfig{})
	})
	b.enqueue(t, task("obs", "ok"))
	h.expect(t, "ok", outSucceeded)
	b.enqueue(t, task("obs", "dead"))
	h.expect(t, "dead", outDead)
	b.enqueue(t, task("obs", "retry"))
	h.expect(t, "retry", outRetried)
	h.expect(t, "retry", outSucceeded)

	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.starts) != 4 || len(rec.ends) != 3 {
		t.Fatalf("starts %v, ends %v: want 4 starts, 3 tasks ended", rec.starts, rec.ends)
	}
	if e := rec.ends["ok"]; e.Outcome != OutcomeSucceeded || e.Err != nil || e.LeaseLost || e.Duration <= 0 {
		t.Errorf("ok: %+v", e)
	}
	if e := rec.ends["dead"]; e.Outcome != OutcomeDead || !errors.Is(e.Err, boom) {
		t.Errorf("dead: %+v, want dead with boom", e)
	}
	if e := rec.ends["retry"]; e.Outcome != OutcomeSucceeded || e.Err != nil {
		t.Errorf("retry, second run: %+v", e)
	}
	claimed := 0
	for _, c := range rec.claims {
		if c.Queue != "obs" || c.Err != nil || c.Claimed > c.Asked || c.Asked < 1 {
			t.Errorf("claim %+v", c)
		}
		claimed += c.Claimed
	}
	if claimed != 4 {
		t.Errorf("claims leased %d tasks, want 4", claimed)
	}
	ev := h.w.obs.(multiObserver)[0].(*promObserver).events
	for e, want := range map[string]float64{"claimed": 4, "succeeded": 2, "failed": 2, "dead": 1, "retried": 1} {
		if got := testutil.ToFloat64(ev.WithLabelValues("obs", e)); got != want {
			t.Errorf("delayq_worker_tasks_total{outcome=%q} = %v, want %v", e, got, want)
		}
	}
}

// Observers skips nil ones, flattens, and chains the contexts of RunStart.
func TestObservers(t *testing.T) {
	t.Parallel()
	if observers() != nil || observers(nil, nil) != nil {
		t.Error("no observer: want nil")
	}
	a, c := &obsRecorder{ends: map[string]RunEndEvent{}}, &obsRecorder{ends: map[string]RunEndEvent{}}
	if observers(nil, a) != Observer(a) {
		t.Error("one observer: want it unwrapped")
	}
	m := observers(observers(a, nil), observers(c))
	if got := len(m.(multiObserver)); got != 2 {
		t.Fatalf("%d observers, want 2", got)
	}
	ctx := m.RunStart(context.Background(), &Task{ID: "x"})
	m.RunEnd(ctx, &Task{ID: "x"}, RunEndEvent{Outcome: OutcomeSucceeded})
	m.Claim(ctx, ClaimEvent{Queue: "q"})
	for _, r := range []*obsRecorder{a, c} {
		if len(r.starts) != 1 || r.ends["x"].Outcome != OutcomeSucceeded || len(r.claims) != 1 {
			t.Errorf("observer saw %+v", r)
		}
	}
}
