package reconcile

import (
	"context"
	"sync"
	"testing"
	"time"
)

type divergences struct {
	mu  sync.Mutex
	got []Divergence
}

func (d *divergences) Divergence(_ context.Context, x Divergence) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.got = append(d.got, x)
}

// The Observer gets every inconsistency Reconcile counts, each once, with its
// kind and whether it was repaired, as the Report counts them.
func TestObserverSeesEachDivergence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	want := b.scenario(t)
	obs := &divergences{}
	rep, err := Reconcile(ctx, b.pool, b.dq, Options{BatchSize: 4, Deep: true, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.got) != rep.Found || rep.Found != len(want) {
		t.Fatalf("%d divergences observed, report found %d, scenario has %d", len(obs.got), rep.Found, len(want))
	}
	found, repaired := map[Kind]int{}, map[Kind]int{}
	for _, d := range obs.got {
		if k := want[d.Queue+"/"+d.ID]; k != d.Kind {
			t.Errorf("observed %+v, scenario says %q", d, k)
		}
		found[d.Kind]++
		if d.Repaired {
			repaired[d.Kind]++
		}
	}
	for _, k := range AllKinds() {
		if found[k] != rep.Kinds[k].Found || repaired[k] != rep.Kinds[k].Repaired {
			t.Errorf("%s: observed %d found, %d repaired; report %d, %d", k, found[k], repaired[k], rep.Kinds[k].Found, rep.Kinds[k].Repaired)
		}
	}
}
