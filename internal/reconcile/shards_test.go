package reconcile

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
)

// The repairs route by the shard count Postgres holds: after a Redis loss, before
// the controls are mirrored back (no count in Redis, which a Client takes for 1
// shard), a pass restores each queued task of a queue of 3 shards into its own
// shard, not into shard 0 (issue 29: a second copy beside the one the relay's
// round put into its shard, beyond the reach of cancel and reschedule).
func TestPassRoutesByPostgresShards(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	const q = "split"
	// Postgres alone: Redis holds no count, as after a loss.
	if _, err := taskstate.New(taskstate.Config{Schema: b.ob.Config().Schema}).SetShards(ctx, b.pool, q, 3); err != nil {
		t.Fatal(err)
	}
	var rows []pgRow
	var ids []string
	for i := range 12 {
		id := fmt.Sprintf("t%02d", i)
		ids = append(ids, id)
		rows = append(rows, pgRow{queue: q, id: id, state: stateQueued})
	}
	b.insertRows(t, rows...)
	if n, err := b.dq.Shards(ctx, q); err != nil || n != 1 {
		t.Fatalf("Shards = %d, %v; want 1 (Redis holds no count)", n, err)
	}
	p, err := NewPass(b.pool, b.dq, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, n, err := p.Step(ctx, q, ""); err != nil || n != len(ids) {
		t.Fatalf("Step = %d, %v; want %d rows", n, err, len(ids))
	}
	if got := p.Report().Kinds[MissingInRedis].Repaired; got != len(ids) {
		t.Errorf("repaired %d missing tasks, want %d", got, len(ids))
	}
	for _, id := range ids {
		var in []int
		for k := range 3 {
			key, err := dispatch.ShardKeys(b.prefix, q, k, 3)
			if err != nil {
				t.Fatal(err)
			}
			if n, err := b.rdb.Exists(ctx, key.TaskKey(id)).Result(); err != nil {
				t.Fatal(err)
			} else if n == 1 {
				in = append(in, k)
			}
		}
		if want := []int{dispatch.ShardOf(id, 3)}; !slices.Equal(in, want) {
			t.Errorf("%s restored into shards %v, want %v only", id, in, want)
		}
	}
}
