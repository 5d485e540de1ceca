package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// healConfig makes self-healing quick to observe: a pass every 100 ms.
func healConfig() relay.Config {
	return relay.Config{RepairPause: 100 * time.Millisecond, LossCheckInterval: 50 * time.Millisecond,
		LeaderRetry: 100 * time.Millisecond}
}

// ownRedisBundle is a bundle on a Redis server of the test's own, which it may
// flush.
func ownRedisBundle(t *testing.T) (testBundle, *redis.Client) {
	t.Helper()
	own := testenv.OwnRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: own.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	return newBundle(t, rdb, "dq"), rdb
}

// A FLUSHALL is detected by the relay through the epoch mark, without any
// operator action: every queued task is back in Redis, at its due time, within
// seconds; the loss is counted, and /readyz says degraded while it repairs.
func TestSelfHealsAfterFlush(t *testing.T) {
	t.Parallel()
	b, rdb := ownRedisBundle(t)
	var tasks []outbox.Task
	for i := range 50 {
		tasks = append(tasks, outbox.Task{Queue: fmt.Sprintf("q%d", i%3), ID: fmt.Sprintf("t%02d", i), Payload: []byte("p"), Delay: time.Minute})
	}
	b.enqueue(t, tasks...)
	rl := b.start(t, healConfig())
	b.waitStates(t, 10*time.Second, map[string]int{"queued": 50})
	// The leader has marked the master and completed its first pass.
	eventually(t, 10*time.Second, func() (bool, string) {
		n, age := rl.metric(t, "delayq_relay_heal_leader"), rl.metric(t, "delayq_relay_repair_pass_age_seconds")
		return n == 1 && age > 0, fmt.Sprintf("leader gauge %v, pass age %v", n, age)
	})
	before := b.info(t, "q0", "t00")
	if err := rdb.FlushAll(ctxT(t)).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() (bool, string) {
		for _, task := range tasks {
			if ti := b.info(t, task.Queue, task.ID); ti.State != dispatch.StateReady {
				return false, fmt.Sprintf("%s/%s in Redis: %s", task.Queue, task.ID, ti.State)
			}
		}
		return true, ""
	})
	if after := b.info(t, "q0", "t00"); !after.Score.Equal(before.Score) {
		t.Errorf("restored due time %v, want %v (its run_at)", after.Score, before.Score)
	}
	if n := rl.metric(t, "delayq_relay_redis_losses_total"); n != 1 {
		t.Errorf("losses counted %v, want 1", n)
	}
	eventually(t, 5*time.Second, func() (bool, string) {
		n := rl.metric(t, "delayq_relay_divergences_total", "kind", "missing_in_redis", "result", "repaired")
		return n == 50, fmt.Sprintf("repaired %v tasks missing in Redis, want 50", n)
	})
	eventually(t, 5*time.Second, func() (bool, string) {
		reason, repairing := rl.Repairing()
		return !repairing, "still repairing: " + reason
	})
}

// A divergence that no loss explains (a task hash deleted by hand) is found and
// repaired by the continuous pass, and counted by kind.
func TestAntiEntropyRepairsADivergence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, outbox.Task{Queue: "q", ID: "x", Payload: []byte("p"), Delay: time.Minute},
		outbox.Task{Queue: "q", ID: "y", Payload: []byte("p"), Delay: time.Minute})
	rl := b.start(t, healConfig())
	b.waitStates(t, 10*time.Second, map[string]int{"queued": 2})
	k, _ := b.dq.Keys("q")
	if err := b.rdb.Del(ctxT(t), k.TaskKey("x")).Err(); err != nil {
		t.Fatal(err)
	}
	b.rdb.ZRem(ctxT(t), k.Ready, "x")
	eventually(t, 10*time.Second, func() (bool, string) {
		ti := b.info(t, "q", "x")
		return ti.State == dispatch.StateReady, "q/x in Redis: " + string(ti.State)
	})
	// The count follows the repair's step by a moment.
	eventually(t, 5*time.Second, func() (bool, string) {
		n := rl.metric(t, "delayq_relay_divergences_total", "kind", "missing_in_redis", "result", "found")
		return n == 1, fmt.Sprintf("divergences found %v, want 1", n)
	})
	if n := rl.metric(t, "delayq_relay_redis_losses_total"); n != 0 {
		t.Errorf("losses counted %v for a divergence, want 0", n)
	}
}

// Two relays on one outbox: one leads the self-healing, never both; the other
// takes over when the leader stops.
func TestOneHealingLeader(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, stopFirst := context.WithCancel(context.Background())
	firstDone := make(chan error, 1)
	reg := prometheus.NewRegistry()
	cfg := healConfig()
	cfg.Registerer, cfg.Logger = reg, testLogger(t)
	rl, err := relay.New(testenv.Pool(t, b.url), b.dq.AsRedis(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	go func() { firstDone <- rl.Run(ctx) }()
	t.Cleanup(func() { stopFirst(); <-firstDone })
	first := running{Relay: rl, reg: reg}
	eventually(t, 10*time.Second, func() (bool, string) {
		return first.metric(t, "delayq_relay_heal_leader") == 1, "the first relay does not lead"
	})
	second := b.start(t, healConfig())
	leaders := func() float64 {
		return first.metric(t, "delayq_relay_heal_leader") + second.metric(t, "delayq_relay_heal_leader")
	}
	// Over ten of the second relay's attempts (LeaderRetry 100 ms), one leader.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for range 10 {
		if n := leaders(); n != 1 {
			t.Fatalf("%v leaders, want 1", n)
		}
		<-tick.C
	}
	stopFirst()
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	firstDone <- nil // for the cleanup
	eventually(t, 10*time.Second, func() (bool, string) {
		return second.metric(t, "delayq_relay_heal_leader") == 1, "the second relay did not take over"
	})
}

// At idle, the self-healing keeps to its command budget: one GET of the epoch mark
// a second, a topology read every fifth, and a pass of nothing (no queued rows)
// every RepairPause: at most 2 Redis commands a second.
func TestSelfHealingIdleBudget(t *testing.T) {
	t.Parallel()
	b, rdb := ownRedisBundle(t)
	rl := b.start(t, relay.Config{ReapInterval: -1, StatsInterval: -1, PollInterval: time.Minute})
	eventually(t, 10*time.Second, func() (bool, string) {
		age := rl.metric(t, "delayq_relay_repair_pass_age_seconds")
		return age > 0, "no pass completed yet"
	})
	processed := func() int64 {
		info, err := rdb.InfoMap(ctxT(t), "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		fmt.Sscan(info["Stats"]["total_commands_processed"], &n)
		return n
	}
	const window = 5 * time.Second
	before := processed()
	timer := time.NewTimer(window)
	<-timer.C
	used := processed() - before - 1 // our own INFO
	if budget := int64(2 * window / time.Second); used > budget {
		t.Errorf("%d Redis commands in %v at idle, budget %d", used, window, budget)
	}
	t.Logf("%d Redis commands in %v at idle", used, window)
}
