package clustertest

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/tempserver"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// TestClusterFailover fails masters over, then moves slots, while producers, a
// relay and two workers run on 50 queues; it reconciles after each step. Every committed task runs exactly once in
// effect (the effects table has no unique constraint), none before it was due.
//
//  1. Crash: the master serving the most queues is killed while its replica lags
//     500ms behind, so the writes it acknowledged in that time — relayed tasks,
//     claims, completions — are lost; its replica is promoted. Reconcile then
//     restores from Postgres what Redis lost, and the workers' guard suppresses
//     the runs that a lost completion or claim brings back.
//  2. Graceful: CLUSTER FAILOVER on the replica of another master, under load. The
//     replica catches up before it takes over: reconcile finds nothing missing.
//  3. Resharding: the slots of 5 queues move to another master, key by key, under
//     load. While a queue's keys move, its scripts are refused (TRYAGAIN: some
//     declared keys are gone, or are never keys, like the task key prefix) and
//     retried; none runs on half a queue. Reconcile finds nothing missing.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	rdb, cl := testenv.RedisCluster(t)
	queues := queueNames()
	perMaster := byMaster(t, rdb, cl, queues)
	masters := make([]string, 0, len(perMaster))
	for addr := range perMaster {
		masters = append(masters, addr)
	}
	sort.Slice(masters, func(i, j int) bool { return len(perMaster[masters[i]]) > len(perMaster[masters[j]]) })

	pg := newPG(t)
	dq := newDQ(t, rdb, "dq", 2*time.Second)
	workers := startEffectWorkers(t, pg, dq, queues)
	runRelay(t, pg.url, dq, relay.Config{BatchSize: 200, PollInterval: 500 * time.Millisecond,
		ReapInterval: 200 * time.Millisecond, StatsInterval: -1, Retention: -1,
		BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()

	total := 0
	// phase runs a load of perQueue tasks per queue, disrupts the cluster after a
	// third of it, waits until every task is done and reconciles.
	phase := func(name string, perQueue int, disrupt func() (string, error)) reconcile.Report {
		t.Helper()
		var tasks []outbox.Task
		for i := range perQueue {
			for _, q := range queues {
				tasks = append(tasks, outbox.Task{Queue: q, ID: fmt.Sprintf("%s%03d", name[:1], i),
					Delay: time.Duration(i%30) * 100 * time.Millisecond})
			}
		}
		total += len(tasks)
		// Producers: transactions of 50 tasks, one every 50ms; the master fails
		// after the first third.
		produced := make(chan error, 1)
		third := make(chan struct{})
		go func() {
			defer close(third)
			for start := 0; start < len(tasks); start += 50 {
				if start == len(tasks)/3/50*50 {
					third <- struct{}{}
				}
				if err := pg.insert(ctx, tasks[start:min(start+50, len(tasks))], 50); err != nil {
					produced <- err
					return
				}
				time.Sleep(50 * time.Millisecond) // the producers' pace, not a wait for a condition
			}
			produced <- nil
		}()
		<-third
		committed := pg.count(t, `SELECT count(*) FROM delayq_outbox`)
		start := time.Now()
		what, err := disrupt()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		took := time.Since(start)
		if err := <-produced; err != nil {
			t.Fatal(err)
		}
		// Reconcile after the failover and the load. Right after a crash the
		// client may still route to the dead master until it reloads the slots:
		// try again for a few seconds.
		var rep reconcile.Report
		eventually(t, 20*time.Second, func() (bool, string) {
			var err error
			rep, err = reconcile.Reconcile(ctx, pg.pool, dq, reconcile.Options{Grace: -1})
			return err == nil, fmt.Sprintf("%s: reconcile: %v", name, err)
		})
		eventually(t, 60*time.Second, func() (bool, string) {
			s := pg.states(t)
			return s["done"] == total, fmt.Sprint(s)
		})
		t.Logf("%s: %s in %v, with %d of %d tasks committed; reconcile: %s",
			name, what, took.Round(time.Millisecond), committed-(total-len(tasks)), len(tasks), describe(rep))
		return rep
	}

	failover := func(victim string, crash bool) func() (string, error) {
		return func() (string, error) {
			var promoted *tempserver.Redis
			var err error
			if crash {
				promoted, err = cl.KillMaster(ctx, cl.Node(victim), 500*time.Millisecond)
			} else {
				promoted, err = cl.Failover(ctx, cl.Node(victim))
			}
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("master %s (%d queues) failed over to %s", victim, len(perMaster[victim]), promoted.Addr()), nil
		}
	}
	crash := phase("crash", 60, failover(masters[0], true))
	graceful := phase("graceful", 30, failover(masters[1], false))
	if b := graceful.Kinds[reconcile.MissingInRedis]; b.Found > 0 {
		t.Errorf("graceful failover: %d tasks missing in Redis, e.g. %v", b.Found, b.Samples)
	}
	reshard := phase("reshard", 30, func() (string, error) {
		// The slots of 5 queues of the third master move to the first one's
		// successor, key by key, under load.
		moved := perMaster[masters[2]][:5]
		to, err := cl.MasterFor(ctx, "{"+perMaster[masters[0]][0]+"}")
		if err != nil {
			return "", err
		}
		for _, q := range moved {
			if err := cl.MoveSlot(ctx, tempserver.Slot("{"+q+"}"), to); err != nil {
				return "", err
			}
		}
		for _, q := range moved {
			if m, err := cl.MasterFor(ctx, "{"+q+"}"); err != nil || m != to {
				return "", fmt.Errorf("queue %s not on %s after the move (%v)", q, to.Addr(), err)
			}
		}
		return fmt.Sprintf("slots of queues %v moved from %s to %s", moved, masters[2], to.Addr()), nil
	})
	if b := reshard.Kinds[reconcile.MissingInRedis]; b.Found > 0 {
		t.Errorf("resharding: %d tasks missing in Redis, e.g. %v", b.Found, b.Samples)
	}

	pg.checkEffects(t)
	if n := pg.count(t, `SELECT count(*) FROM effects`); n != total {
		t.Errorf("%d effects for %d tasks", n, total)
	}
	// Nothing left over in Redis either.
	inc, err := reconcile.Check(ctx, pg.pool, dq, reconcile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range inc {
		t.Errorf("after the run: %+v", x)
	}
	var suppressed int64
	for _, w := range workers {
		suppressed += w.RunStats().Suppressed
	}
	restored, removed := 0, 0
	for _, r := range []reconcile.Report{crash, graceful, reshard} {
		restored += r.Kinds[reconcile.MissingInRedis].Repaired
		removed += r.Kinds[reconcile.FinishedInPostgres].Repaired
	}
	t.Logf("cluster faults: %d tasks on %d queues, 2 masters failed over (1 crashed with a lagging replica, 1 gracefully), 5 slots moved; "+
		"reconcile restored %d tasks missing in Redis and removed %d finished ones; %d duplicate runs suppressed; lost 0, duplicated effects 0",
		total, len(queues), restored, removed, suppressed)
}

// describe summarizes a reconcile report: the kinds found, with repairs.
func describe(r reconcile.Report) string {
	var parts []string
	for k, b := range r.Kinds {
		if b.Found > 0 {
			parts = append(parts, fmt.Sprintf("%s %d (repaired %d, skipped %d, e.g. %v)", k, b.Found, b.Repaired, b.Skipped, b.Samples[:min(3, len(b.Samples))]))
		}
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		parts = []string{"nothing to repair"}
	}
	return fmt.Sprintf("%d rows, %d expired leases left to the reaper; %s",
		r.Rows, r.ExpiredLeases.Found, strings.Join(parts, "; "))
}
