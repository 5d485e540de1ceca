package relay_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// Issue 29, defect 1: Redis loses its data while the relay is down, and tasks of a
// queue of 3 shards are committed meanwhile. The relay that starts (a process of
// its own, whose Client finds no shard count in Redis) moves them by the count
// Postgres holds: its first round, made before its control loop mirrored the
// count back, puts each task into its own shard, and the self-healing pass that
// follows finds nothing to restore. Each task is in its own shard and nowhere
// else, and with a plain handler each runs exactly once. (Before: the round put
// all 12 into shard 0, the pass restored 8 into their shards, and 20 copies ran.)
func TestRedisLossShardedRelayDown(t *testing.T) {
	t.Parallel()
	b, rdb := ownRedisBundle(t)
	ctx := ctxT(t)
	const queue = "split"
	ctl, err := queuectl.New(b.pool, b.dq, b.ob.Config().Schema)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.SetShards(ctx, queue, 3); err != nil {
		t.Fatal(err)
	}
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var tasks []outbox.Task
	ids := make([]string, 12)
	for i := range ids {
		ids[i] = fmt.Sprintf("t%02d", i)
		tasks = append(tasks, task(queue, ids[i]))
	}
	b.enqueue(t, tasks...)

	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: b.prefix})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := healConfig()
	cfg.Registerer, cfg.Logger = reg, testLogger(t)
	rl, err := relay.New(testenv.Pool(t, b.url), dq.AsRedis(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The first round, on its own: before the control loop or self-healing ran.
	if n, err := rl.Round(ctx); err != nil || n != len(ids) {
		t.Fatalf("first round moved %d, %v; want %d", n, err, len(ids))
	}
	run(t, rl.Run)
	rr := running{Relay: rl, reg: reg}
	eventually(t, 10*time.Second, func() (bool, string) {
		age := rr.metric(t, "delayq_relay_repair_pass_age_seconds")
		return age > 0, "no self-healing pass completed"
	})

	layout := make([]dispatch.Keys, 3)
	for k := range layout {
		if layout[k], err = dispatch.ShardKeys(b.prefix, queue, k, 3); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		var in []int
		for k, key := range layout {
			if n, err := rdb.Exists(ctx, key.TaskKey(id)).Result(); err != nil {
				t.Fatal(err)
			} else if n == 1 {
				in = append(in, k)
			}
		}
		if want := []int{dispatch.ShardOf(id, 3)}; !slices.Equal(in, want) {
			t.Errorf("%s: task hash in shards %v, want %v only", id, in, want)
		}
	}

	var (
		mu   sync.Mutex
		runs = map[string]int{}
	)
	wdq, err := dispatch.New(rdb, dispatch.Config{Prefix: b.prefix})
	if err != nil {
		t.Fatal(err)
	}
	w, err := clientkit.NewClient(b.pool, wdq, b.ob, delayq.WorkerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Handle(queue, func(_ context.Context, tk *delayq.Task) error {
		mu.Lock()
		runs[tk.ID]++
		mu.Unlock()
		return nil
	}, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	run(t, w.Run)
	b.waitStates(t, 10*time.Second, map[string]int{"done": len(ids)})
	// Every copy Redis held is gone: nothing is left to run again.
	eventually(t, 10*time.Second, func() (bool, string) {
		var left int64
		for _, key := range layout {
			for _, z := range []string{key.Ready, key.Active} {
				n, err := rdb.ZCard(ctx, z).Result()
				if err != nil {
					return false, err.Error()
				}
				left += n
			}
		}
		return left == 0, fmt.Sprintf("%d tasks still ready or active in Redis", left)
	})
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if runs[id] != 1 {
			t.Errorf("%s ran %d times, want once", id, runs[id])
		}
	}
}

// run calls f until the test ends; f must then return nil.
func run(t *testing.T, f func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}
