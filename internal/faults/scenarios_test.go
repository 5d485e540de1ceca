package faults

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/faultproxy"
	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/testenv"
)

// Sizes of the loads: a few thousand tasks over a few seconds, so that each
// scenario ends within about half a minute on a loaded 2-core machine with the
// race detector.
const (
	loadTasks = 2000
	loadTime  = 8 * time.Second
)

// Worker processes SIGKILLed at random points while a load runs, and started
// again: the tasks they held run again after their lease, once in effect. Also
// with group commit, where a kill lands between the savepoints of a group.
func TestWorkerKill(t *testing.T) {
	t.Parallel()
	for _, sc := range []struct {
		name          string
		group, shards int
	}{{"worker-kill", 0, 0}, {"worker-kill-group", 8, 0}, {"worker-kill-sharded", 0, 3}} {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			workerKill(t, sc.name, sc.group, sc.shards)
		})
	}
}

func workerKill(t *testing.T, scenario string, group, shards int) {
	s := newSystem(t, scenario, testenv.PostgresURL(t), testenv.OwnRedis(t).URL())
	s.groupCommit = group
	ctx := s.ctx()
	s.shardQueues(ctx, shards)
	s.runRelay("relay")
	workers := s.startFleet("worker", 2)
	l := s.newLoad(loadTasks, loadTime)
	done := l.start(ctx)

	s.waitEffects(ctx, 50)
	const kills = 5
	for workers.kills.Load() < kills && pause(ctx, between(500*time.Millisecond, 1200*time.Millisecond)) {
		workers.killRandom()
	}
	wait(ctx, done)
	res := s.check(ctx, l, checkOpts{faults: int(workers.kills.Load())})
	if n := workers.kills.Load(); n < kills {
		t.Errorf("%d worker kills, want %d", n, kills)
	}
	if res.reruns == 0 {
		t.Errorf("no task ran twice: no kill interrupted a run, the fault never bit")
	}
}

// Relay processes that kill themselves (SIGKILL) between the Redis write of a
// round and its Postgres commit (right after the pipeline returned, or as the
// COMMIT is about to go), and relays SIGKILLed at random; workers run in this
// process. The rows of a dead round stay pending and are moved again (Redis
// reports duplicates); a task a worker ran meanwhile is done and stays done.
//
// By default Redis keeps no record of finished tasks (DoneRetention -1: a task's
// hash is deleted at completion): the outbox alone keeps a finished task from
// being moved again, because the relay moves only pending rows, under their lock.
// Also with a done record kept (DoneRetention 7 days).
func TestRelayKill(t *testing.T) {
	t.Parallel()
	for _, sc := range []struct {
		name          string
		doneRetention time.Duration
	}{{"relay-kill", 0}, {"relay-kill-done-record", 7 * 24 * time.Hour}} {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			relayKill(t, sc.name, sc.doneRetention)
		})
	}
}

func relayKill(t *testing.T, scenario string, doneRetention time.Duration) {
	s := newSystem(t, scenario, testenv.PostgresURL(t), testenv.OwnRedis(t).URL())
	s.doneRetention = doneRetention
	ctx := s.ctx()
	relays := s.startFleet("relay", 2,
		"redis:1", "commit:1", "redis:2", "commit:1", "redis:1", "commit:2")
	s.runWorker("worker-a")
	s.runWorker("worker-b")
	l := s.newLoad(loadTasks, loadTime)
	done := l.start(ctx)

	s.waitEffects(ctx, 50)
	const kills = 3
	for relays.kills.Load() < kills && pause(ctx, between(800*time.Millisecond, 1600*time.Millisecond)) {
		relays.killRandom()
	}
	wait(ctx, done)
	s.check(ctx, l, checkOpts{faults: int(relays.kills.Load() + relays.selfKills.Load())})
	relays.mu.Lock()
	t.Logf("relays killed themselves at: %v", relays.points)
	relays.mu.Unlock()
	if n := relays.selfKills.Load(); n < 4 {
		t.Errorf("%d relays killed themselves between the Redis write and the commit, want at least 4", n)
	}
	if n := relays.kills.Load(); n < kills {
		t.Errorf("%d relays SIGKILLed at random, want %d", n, kills)
	}
	// The workers applied doneRetention: a finished task's hash is kept (done) or
	// gone (missing).
	want := dispatch.StateMissing
	if doneRetention > 0 {
		want = dispatch.StateDone
	}
	var q, id string
	if err := s.admin.QueryRow(ctx, `SELECT queue, task_id FROM delayq_outbox WHERE state = 'done' LIMIT 1`).Scan(&q, &id); err != nil {
		t.Fatalf("a done row: %v", err)
	}
	if ti, err := s.dq.Inspect(ctx, q, id); err != nil || ti[0].State != want {
		t.Errorf("finished task %s/%s in Redis: %v, %v; want %s", q, id, ti, err, want)
	}
}

// Redis, without persistence, killed and started again (empty) twice while the
// load runs: the relay detects each loss by its epoch mark and puts back what
// Postgres has queued, by itself (no reconcile). Also with queues of 3 shards,
// whose shard counts are lost with the rest and restored from Postgres.
func TestRedisRestart(t *testing.T) {
	t.Parallel()
	for _, sc := range []struct {
		name   string
		shards int
	}{{"redis-restart", 0}, {"redis-restart-sharded", 3}} {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			redisRestart(t, sc.name, sc.shards)
		})
	}
}

func redisRestart(t *testing.T, scenario string, shards int) {
	own := testenv.OwnRedis(t)
	s := newSystem(t, scenario, testenv.PostgresURL(t), own.URL())
	ctx := s.ctx()
	s.shardQueues(ctx, shards)
	s.runRelay("relay")
	s.runWorker("worker-a")
	s.runWorker("worker-b")
	l := s.newLoad(loadTasks, loadTime)
	done := l.start(ctx)

	s.waitEffects(ctx, 50)
	restarts, lost := 0, 0
	for range 2 {
		if !pause(ctx, between(1500*time.Millisecond, 2500*time.Millisecond)) {
			break
		}
		lost += s.queuedRows(ctx)
		own.Kill()
		pause(ctx, between(200*time.Millisecond, 800*time.Millisecond))
		if err := own.Start(ctx); err != nil {
			t.Fatalf("start Redis again: %v", err)
		}
		restarts++
	}
	wait(ctx, done)
	s.check(ctx, l, checkOpts{faults: restarts, redisLost: true})
	if restarts < 2 {
		t.Errorf("%d Redis restarts, want 2", restarts)
	}
	if lost == 0 {
		t.Errorf("no task was queued when Redis restarted: the fault never bit")
	}
	if !strings.Contains(s.logs.String(), "Redis lost data") {
		t.Errorf("the relay never detected the loss")
	}
}

// Postgres goes down and comes back twice while the load runs, once stopped (fast
// shutdown: every session ended) and once killed (SIGKILL to every process: crash
// recovery at start): the relay, the workers and the producer recover by
// themselves, and no committed task is lost.
func TestPostgresRestart(t *testing.T) {
	t.Parallel()
	pg := testenv.OwnPostgres(t)
	s := newSystem(t, "postgres-restart", pg.URL(), testenv.OwnRedis(t).URL())
	ctx := s.ctx()
	s.runRelay("relay")
	s.runWorker("worker-a")
	s.runWorker("worker-b")
	l := s.newLoad(loadTasks, loadTime)
	done := l.start(ctx)

	s.waitEffects(ctx, 50)
	restarts := 0
	for range 2 {
		if !pause(ctx, between(1500*time.Millisecond, 2500*time.Millisecond)) {
			break
		}
		if restarts == 0 {
			pg.Stop()
		} else {
			pg.Kill()
		}
		pause(ctx, between(300*time.Millisecond, time.Second))
		if err := pg.Start(ctx); err != nil {
			t.Fatalf("start Postgres again: %v", err)
		}
		restarts++
	}
	wait(ctx, done)
	s.check(ctx, l, checkOpts{faults: restarts})
	if restarts < 2 {
		t.Errorf("%d Postgres restarts, want 2", restarts)
	}
	if l.errs == 0 {
		t.Errorf("the producer never saw Postgres down: the restarts did not bite")
	}
}

// Redis behind a TCP proxy that first delays every chunk by 200ms each way, then
// cuts every connection for a few seconds, twice: commands time out and are
// retried, acks are lost after commits, leases expire; nothing is lost and no
// effect is applied twice.
func TestRedisSlowAndCut(t *testing.T) {
	t.Parallel()
	own := testenv.OwnRedis(t)
	proxy, err := faultproxy.Start(own.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	s := newSystem(t, "redis-slow-cut", testenv.PostgresURL(t), own.URL())
	s.redisURL = "redis://" + proxy.Addr() + "/0" // the product's clients go through the proxy
	ctx := s.ctx()
	s.runRelay("relay")
	s.runWorker("worker-a")
	s.runWorker("worker-b")
	l := s.newLoad(loadTasks, loadTime)
	done := l.start(ctx)

	s.waitEffects(ctx, 50)
	faults := 0
	proxy.SetLatency(200 * time.Millisecond)
	faults++
	pause(ctx, 3*time.Second)
	proxy.SetLatency(0)
	for _, cut := range []time.Duration{between(2*time.Second, 3*time.Second), between(time.Second, 2*time.Second)} {
		if !pause(ctx, between(300*time.Millisecond, time.Second)) {
			break
		}
		proxy.Cut()
		faults++
		pause(ctx, cut)
		proxy.Restore()
	}
	wait(ctx, done)
	s.check(ctx, l, checkOpts{faults: faults})
}

// waitEffects waits until the handlers have written n effects: the system is
// running, and a fault now lands in the middle of it.
func (s *system) waitEffects(ctx context.Context, n int) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tk := time.NewTicker(50 * time.Millisecond)
	defer tk.Stop()
	for {
		var got int
		err := s.admin.QueryRow(ctx, `SELECT count(*) FROM fault_effects`).Scan(&got)
		if err == nil && got >= n {
			return
		}
		select {
		case <-ctx.Done():
			s.t.Fatalf("only %d effects within 30s (last error %v): the system does not run", got, err)
		case <-tk.C:
		}
	}
}

// reconcile runs reconcile.Reconcile until a run neither fails nor skips a task
// (a row locked by a worker's guard, say, is skipped and looked at again by the
// next run), for up to 25 runs.
// It returns how many tasks the runs found missing from Redis.
func (s *system) reconcile(ctx context.Context) (missingFound int) {
	s.t.Helper()
	// Rows locked by a run are skipped, and a group-commit worker holds its rows
	// locked until the group commits, past a slow handler (the model's: 2.2 s).
	for run := 1; run <= 25; run++ {
		rep, err := reconcile.Reconcile(ctx, s.admin, s.dq, reconcile.Options{Queues: s.queues})
		missing := 0
		if b := rep.Kinds[reconcile.MissingInRedis]; b != nil {
			missing = b.Found
		}
		missingFound += missing
		s.t.Logf("reconcile run %d: %d rows, found %d (missing in Redis %d), repaired %d, skipped %d, err %v",
			run, rep.Rows, rep.Found, missing, rep.Repaired, rep.Skipped, err)
		if err == nil && rep.Skipped == 0 {
			return missingFound
		}
		if !pause(ctx, 200*time.Millisecond) {
			break
		}
	}
	s.t.Errorf("reconcile did not end a run without errors or skipped tasks")
	return missingFound
}

// wait waits for done or the end of ctx.
func wait(ctx context.Context, done <-chan struct{}) {
	select {
	case <-done:
	case <-ctx.Done():
	}
}
