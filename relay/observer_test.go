package relay_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/relayobs"
	"github.com/delayq/delayq/relay"
)

// moveRecorder is a user's Observer: it keeps the moves it saw.
type moveRecorder struct {
	mu  sync.Mutex
	all []relay.MoveEvent
}

func (r *moveRecorder) Move(_ context.Context, e relay.MoveEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, e)
}

func (r *moveRecorder) moves() []relay.MoveEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.all)
}

// eventRecorder is an Observer of the module's own that keeps every event the
// relay sent it.
type eventRecorder struct {
	mu     sync.Mutex
	events []relayobs.Event
}

func (*eventRecorder) Move(context.Context, relay.MoveEvent) {}

func (r *eventRecorder) Observe(_ context.Context, e relayobs.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// Two relays and a worker share one registry (the collectors, counters adding
// up); each relay's Observer and Stats see its own rounds, with the tasks moved.
func TestObserverAndSharedRegistry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	reg := prometheus.NewRegistry()
	rec1, rec2 := &moveRecorder{}, &moveRecorder{}
	r1, err := relay.New(b.pool, b.dq.AsRedis(), relay.Config{Registerer: reg, Observer: rec1})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := relay.New(b.pool, b.dq.AsRedis(), relay.Config{Registerer: reg, Observer: rec2})
	if err != nil {
		t.Fatalf("second relay on the registry: %v", err)
	}
	if _, err := clientkit.NewClient(b.pool, b.dq, b.ob, delayq.WorkerConfig{Registerer: reg}); err != nil {
		t.Fatalf("a worker on the relays' registry: %v", err)
	}

	b.enqueue(t, task("obs", "a"), task("obs", "b"))
	if n, err := r1.Round(ctx); err != nil || n != 2 {
		t.Fatalf("round 1: %d, %v", n, err)
	}
	b.enqueue(t, task("obs", "c"))
	if n, err := r2.Round(ctx); err != nil || n != 1 {
		t.Fatalf("round 2: %d, %v", n, err)
	}

	m1, m2 := rec1.moves(), rec2.moves()
	if len(m1) != 1 || len(m2) != 1 {
		t.Fatalf("moves %+v / %+v, want one each", m1, m2)
	}
	var ids []string
	for _, tk := range m1[0].Tasks {
		ids = append(ids, tk.Queue+"/"+tk.ID)
	}
	slices.Sort(ids)
	if m1[0].Added != 2 || !slices.Equal(ids, []string{"obs/a", "obs/b"}) || m1[0].Duration <= 0 || m1[0].Start.IsZero() {
		t.Errorf("relay 1 move %+v (tasks %v)", m1[0], ids)
	}
	if s := r1.Stats(); s.Rounds != 1 || s.Added != 2 || s.Errors != 0 {
		t.Errorf("relay 1 stats %+v", s)
	}
	if s := r2.Stats(); s.Rounds != 1 || s.Added != 1 {
		t.Errorf("relay 2 stats %+v", s)
	}
	r := running{Relay: r1, reg: reg}
	if got := r.metric(t, "delayq_relay_rows_total", "result", "added"); got != 3 {
		t.Errorf("delayq_relay_rows_total{result=added} = %v, want 3 (both relays)", got)
	}
}

// Errors reach the Observer and Stats with their kind, and the Prometheus
// counter; Stats counts without a Registerer.
func TestObserverErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &eventRecorder{}
	rl, err := relay.New(b.pool, b.dq.AsRedis(), relay.WithAfterEnqueue(relay.Config{Observer: rec}, func() error {
		return errors.New("injected")
	}))
	if err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, task("obs", "a"))
	if _, err := rl.Round(ctxT(t)); err == nil {
		t.Fatal("round with a failing hook: no error")
	}
	if s := rl.Stats(); s.Errors != 1 || s.Rounds != 0 {
		t.Errorf("stats %+v, want one error and no round", s)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.events) != 1 {
		t.Fatalf("events %+v, want one", rec.events)
	}
	if e, ok := rec.events[0].(relayobs.ErrorEvent); !ok || e.Kind != "postgres" || e.Err == nil {
		t.Errorf("event %+v, want a postgres ErrorEvent", rec.events[0])
	}
}
