package reconcile

import (
	"testing"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
)

// TestRestoreControlsMirrorsShards sets a queue's shard count and pause in
// Postgres only (taskstate's statements, as a control operation whose Redis
// write failed leaves them): RestoreControls mirrors both, and a later pause or resume
// mirrored the same way keeps the count (a mirror without it would fold the queue
// into one shard).
func TestRestoreControlsMirrorsShards(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	st := taskstate.New(taskstate.Config{Schema: "public"})
	if _, err := st.SetShards(ctx, b.pool, "wide", 4); err != nil {
		t.Fatal(err)
	}
	pg, err := st.SetPaused(ctx, b.pool, "wide", true)
	if err != nil {
		t.Fatal(err)
	}
	check := func(wantPaused bool, wantVersion int64) {
		t.Helper()
		n, err := RestoreControls(ctx, b.pool, b.dq, Options{})
		if err != nil || n != 1 {
			t.Fatalf("RestoreControls = %d, %v; want 1 restored", n, err)
		}
		c, v, err := b.dq.Controls(ctx, "wide")
		if err != nil || v != wantVersion || c.Shards != 4 || c.Paused != wantPaused {
			t.Fatalf("Redis holds %+v version %d (%v); want 4 shards, paused %v, version %d", c, v, err, wantPaused, wantVersion)
		}
		if n, err := RestoreControls(ctx, b.pool, b.dq, Options{}); err != nil || n != 0 {
			t.Fatalf("RestoreControls again = %d, %v; want 0", n, err)
		}
	}
	check(true, pg.Version)
	pg, err = st.SetPaused(ctx, b.pool, "wide", false)
	if err != nil {
		t.Fatal(err)
	}
	check(false, pg.Version)
	// A task enqueued now goes to its shard of 4.
	id := "t-1"
	for dispatch.ShardOf(id, 4) == 0 {
		id += "x"
	}
	if _, err := b.dq.Enqueue(ctx, "wide", dispatch.Task{ID: id, RunAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	k, err := dispatch.ShardKeys(b.prefix, "wide", dispatch.ShardOf(id, 4), 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.rdb.ZScore(ctx, k.Ready, id).Result(); err != nil {
		t.Fatalf("%s is not in its shard's ready set %s: %v", id, k.Ready, err)
	}
}
