package clustertest

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// The master serving the most queues is killed while its replica lags 500ms
// behind, under load, and nobody runs reconcile: the relay sees the shard's
// master change (its node id) and repairs from Postgres what the promoted replica
// never received. Every task runs once in effect, none before it was due.
func TestClusterFailoverSelfHeals(t *testing.T) {
	t.Parallel()
	rdb, cl := testenv.RedisCluster(t)
	queues := queueNames()[:20]
	perMaster := byMaster(t, rdb, cl, queues)
	masters := make([]string, 0, len(perMaster))
	for addr := range perMaster {
		masters = append(masters, addr)
	}
	sort.Slice(masters, func(i, j int) bool { return len(perMaster[masters[i]]) > len(perMaster[masters[j]]) })

	pg := newPG(t)
	dq := newDQ(t, rdb, "dq", 2*time.Second)
	startEffectWorkers(t, pg, dq, queues)
	reg := prometheus.NewRegistry()
	rl := runRelay(t, pg.url, dq, relay.Config{Registerer: reg, BatchSize: 200, PollInterval: 500 * time.Millisecond,
		ReapInterval: 200 * time.Millisecond, StatsInterval: -1, Retention: -1,
		BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
		LossCheckInterval: 100 * time.Millisecond, RepairPause: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Tasks due over 3 s, in transactions of 50 every 50ms; the master dies after
	// a third of them.
	var tasks []outbox.Task
	for i := range 60 {
		for _, q := range queues {
			tasks = append(tasks, outbox.Task{Queue: q, ID: fmt.Sprintf("h%03d", i), Delay: time.Duration(i%30) * 100 * time.Millisecond})
		}
	}
	for start := 0; start < len(tasks)/3; start += 50 {
		if err := pg.insert(ctx, tasks[start:min(start+50, len(tasks))], 50); err != nil {
			t.Fatal(err)
		}
	}
	promoted, err := cl.KillMaster(ctx, cl.Node(masters[0]), 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	for start := len(tasks) / 3 / 50 * 50; start < len(tasks); start += 50 {
		if err := pg.insert(ctx, tasks[start:min(start+50, len(tasks))], 50); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 90*time.Second, func() (bool, string) {
		s := pg.states(t)
		return s["done"] == len(tasks), fmt.Sprint(s)
	})
	pg.checkEffects(t)
	if n := pg.count(t, `SELECT count(*) FROM effects`); n != len(tasks) {
		t.Errorf("%d effects for %d tasks", n, len(tasks))
	}
	if losses := counterValue(t, reg, "delayq_relay_redis_losses_total"); losses < 1 {
		t.Errorf("the relay detected %v losses, want the failover's", losses)
	}
	if reason, repairing := rl.Repairing(); repairing {
		t.Errorf("still repairing: %s", reason)
	}
	epochs, err := dq.Epochs(ctx)
	if err != nil || len(epochs) != len(perMaster) {
		t.Fatalf("epochs %+v %v, want one per master", epochs, err)
	}
	for _, e := range epochs {
		if e.Value == "" || e.Node == "" {
			t.Errorf("epoch %+v after the repair: want a mark and a node", e)
		}
	}
	t.Logf("master %s (%d queues) failed over to %s; %d tasks done once, no reconcile",
		masters[0], len(perMaster[masters[0]]), promoted.Addr(), len(tasks))
}

// counterValue reads a counter without labels from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}
