package relay_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/relay"
)

// TestControlSyncRepairsAFailedWrite: changes of a sharded queue's controls whose
// Redis write failed (Redis unreachable from the caller) are committed in
// Postgres and reported as delayq.ErrNotMirrored; the running relay's control
// sync then writes them into every shard, at Postgres's version. The test waits
// on the wake-up the sync's write of a changed limit publishes in each shard.
func TestControlSyncRepairsAFailedWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	queues, err := clientkit.NewClient(b.pool, b.dq, b.ob, delayq.WorkerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := queues.SetShards(ctx, "mail", 3); err != nil {
		t.Fatal(err)
	}
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = down.Close() })
	dqDown, err := dispatch.New(down, dispatch.Config{Prefix: b.prefix})
	if err != nil {
		t.Fatal(err)
	}
	failing, err := clientkit.NewClient(b.pool, dqDown, b.ob, delayq.WorkerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := failing.Pause(ctx, "mail"); !errors.Is(err, delayq.ErrNotMirrored) {
		t.Fatalf("pause: %v, want ErrNotMirrored", err)
	}
	if _, err := failing.Resume(ctx, "mail"); !errors.Is(err, delayq.ErrNotMirrored) {
		t.Fatalf("resume: %v, want ErrNotMirrored", err)
	}
	want, err := failing.SetRateLimit(ctx, "mail", delayqtype.RateLimit{Limit: 20})
	if !errors.Is(err, delayq.ErrNotMirrored) {
		t.Fatalf("limit: %v, want ErrNotMirrored", err)
	}
	if _, v, err := b.dq.Controls(ctx, "mail"); err != nil || v >= want.Version {
		t.Fatalf("Redis at version %d (%v) before the relay runs, want older than %d", v, err, want.Version)
	}

	keys, err := b.dq.Keys("mail")
	if err != nil {
		t.Fatal(err)
	}
	sub := b.rdb.Subscribe(ctx, keys.Wake) // every shard's wake channel
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(ctx); err != nil { // the subscription is in place
		t.Fatal(err)
	}
	b.start(t, relay.Config{})
	deadline := time.After(3 * queuectl.SyncInterval)
	for woken := 0; woken < 3; woken++ { // one a shard
		select {
		case <-sub.Channel():
		case <-deadline:
			t.Fatalf("%d of 3 shards woken by the relay's control sync in %v", woken, 3*queuectl.SyncInterval)
		}
	}
	got, v, err := b.dq.Controls(ctx, "mail")
	if err != nil || v != want.Version || got != (dispatch.Controls{Rate: want.Rate, Shards: 3}) {
		t.Fatalf("Redis holds %+v at version %d (%v); want %+v at version %d", got, v, err, want, want.Version)
	}
}
