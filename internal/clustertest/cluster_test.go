package clustertest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/tempserver"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// TestCluster runs the core, relay, worker and wake-up tests on one Redis Cluster
// (3 masters, one replica each) with 50 queues spread over its slots and every
// master. The subtests run in parallel, each under a key prefix of its own.
func TestCluster(t *testing.T) {
	t.Parallel()
	rdb, cl := testenv.RedisCluster(t)
	queues := queueNames()
	perMaster := byMaster(t, rdb, cl, queues)
	for addr, qs := range perMaster {
		t.Logf("master %s: %d queues", addr, len(qs))
	}
	// Before the parallel subtests, which load the scripts as they go.
	t.Run("PipelinedPartlyKnownScript", func(t *testing.T) { testPartlyKnownScript(t, rdb, queues, perMaster) })
	t.Run("Delayq", func(t *testing.T) { t.Parallel(); testDelayq(t, rdb, queues) })
	t.Run("Waiter", func(t *testing.T) { t.Parallel(); testWaiter(t, rdb, queues) })
	t.Run("Relay", func(t *testing.T) { t.Parallel(); testRelay(t, rdb, queues) })
	t.Run("Worker", func(t *testing.T) { t.Parallel(); testWorker(t, rdb, queues) })
	t.Run("SlotMigration", func(t *testing.T) { t.Parallel(); testSlotMigration(t, rdb, cl, queues) })
}

// testPartlyKnownScript: one master knows the enqueue script and the others do
// not (a restarted node, a SCRIPT FLUSH). A pipelined enqueue over every queue runs
// on the first master at once and is refused elsewhere; only the refused calls go
// again, so every status is Added, none Duplicate.
func testPartlyKnownScript(t *testing.T, rdb *redis.ClusterClient, queues []string, perMaster map[string][]string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return m.ScriptFlush(ctx).Err()
	}); err != nil {
		t.Fatal(err)
	}
	dq := newDQ(t, rdb, testenv.ClusterPrefix(t, rdb), 2*time.Second)
	var warm string
	for _, qs := range perMaster {
		warm = qs[0]
		break
	}
	// A single enqueue loads the script on that queue's master only.
	if _, err := dq.Enqueue(ctx, warm, dispatch.Task{ID: "warm-up"}); err != nil {
		t.Fatal(err)
	}
	batches := make([]dispatch.QueueTasks, len(queues))
	for i, q := range queues {
		batches[i] = dispatch.QueueTasks{Queue: q, Tasks: []dispatch.Task{{ID: "a"}, {ID: "b"}}}
	}
	for round, want := range []dispatch.EnqueueStatus{dispatch.Added, dispatch.Duplicate} {
		st, err := dq.EnqueuePipelined(ctx, batches)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for i, b := range st {
			for j, s := range b {
				if s != want {
					t.Errorf("round %d: %s/%s: %v, want %v", round, queues[i], batches[i].Tasks[j].ID, s, want)
				}
			}
		}
	}
}

// What the claimers of testDelayq do with a task at its first run.
const (
	kComplete = iota
	kRetry    // Retry with a delay, then complete the second run
	kAbandon  // let its lease run out at once: the reaper gives it back, then complete
	kKill     // Kill: dead
)

func kindOf(i int) int {
	switch {
	case i%10 == 0:
		return kRetry
	case i%10 == 1:
		return kAbandon
	case i%20 == 2:
		return kKill
	}
	return kComplete
}

// testDelayq: enqueue (pipelined over every node), claim with concurrent claimers,
// complete, retry, kill and reap on 50 queues. Every run of a task is claimed
// exactly once, never before it is due.
func testDelayq(t *testing.T, rdb *redis.ClusterClient, queues []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dq := newDQ(t, rdb, testenv.ClusterPrefix(t, rdb), 2*time.Second)

	const perQueue = 40
	// A lease long enough for any claimer, however loaded the machine; abandoned
	// tasks have theirs cut to 1ms (Extend) and are left to the reaper.
	const lease = 30 * time.Second
	const retryDelay = 200 * time.Millisecond
	base := time.Now().Add(300 * time.Millisecond)
	type want struct {
		due  time.Time
		kind int
	}
	tasks := map[string]want{} // "queue/id"
	batches := make([]dispatch.QueueTasks, len(queues))
	var nKill, nTwice int
	for qi, q := range queues {
		batches[qi].Queue = q
		for i := range perQueue {
			id := fmt.Sprintf("t%03d", i)
			due := base.Add(time.Duration((qi*7+i*37)%1500) * time.Millisecond).Truncate(time.Millisecond)
			batches[qi].Tasks = append(batches[qi].Tasks, dispatch.Task{ID: id, Payload: []byte(q + "/" + id), RunAt: due})
			k := kindOf(i)
			tasks[q+"/"+id] = want{due, k}
			switch k {
			case kKill:
				nKill++
			case kRetry, kAbandon:
				nTwice++
			}
		}
	}
	total := len(tasks)

	// One pipelined call for all 50 queues: the cluster client splits it by node.
	st, err := dq.EnqueuePipelined(ctx, batches)
	if err != nil {
		t.Fatalf("EnqueuePipelined: %v", err)
	}
	for i, b := range st {
		for j, s := range b {
			if s != dispatch.Added {
				t.Fatalf("%s/%s: %v, want added", queues[i], batches[i].Tasks[j].ID, s)
			}
		}
	}
	// Again: every task is a duplicate, on every node.
	st, err = dq.EnqueuePipelined(ctx, batches)
	if err != nil {
		t.Fatalf("EnqueuePipelined again: %v", err)
	}
	for i, b := range st {
		for j, s := range b {
			if s != dispatch.Duplicate {
				t.Fatalf("%s/%s enqueued again: %v, want duplicate", queues[i], batches[i].Tasks[j].ID, s)
			}
		}
	}

	var (
		claims   counter // "queue/id#attempt" -> times claimed
		finished atomic.Int64
		mu       sync.Mutex
		first    = map[string]time.Time{} // Redis clock at the first claim
		reaped   counter
	)
	claimOne := func(ct dispatch.ClaimedTask, now time.Time) {
		key := ct.Queue + "/" + ct.ID
		w, ok := tasks[key]
		if !ok {
			t.Errorf("claimed unknown task %s", key)
			return
		}
		if n := claims.add(fmt.Sprintf("%s#%d", key, ct.Attempt)); n > 1 {
			t.Errorf("%s attempt %d claimed %d times", key, ct.Attempt, n)
		}
		if now.Before(ct.Due) {
			t.Errorf("%s claimed at %v, before it was due at %v", key, now, ct.Due)
		}
		if string(ct.Payload) != key {
			t.Errorf("%s: payload %q", key, ct.Payload)
		}
		var err error
		switch {
		case ct.Attempt == 1:
			if !ct.Due.Equal(w.due) {
				t.Errorf("%s due %v, enqueued for %v", key, ct.Due, w.due)
			}
			mu.Lock()
			first[key] = now
			mu.Unlock()
			switch w.kind {
			case kComplete:
				err = dq.Complete(ctx, ct.Queue, ct.ID, ct.Token)
				finished.Add(1)
			case kRetry:
				var dead bool
				dead, err = dq.Retry(ctx, ct.Queue, ct.ID, ct.Token, retryDelay, errInjected.Error())
				if dead {
					t.Errorf("%s dead after one retry", key)
				}
			case kAbandon:
				err = dq.Extend(ctx, ct.Queue, ct.ID, ct.Token, time.Millisecond)
			case kKill:
				err = dq.Kill(ctx, ct.Queue, ct.ID, ct.Token, errInjected.Error())
				finished.Add(1)
			}
		case ct.Attempt == 2 && (w.kind == kRetry || w.kind == kAbandon):
			mu.Lock()
			f := first[key]
			mu.Unlock()
			if w.kind == kRetry && ct.Due.Before(f.Add(retryDelay)) {
				t.Errorf("%s retried with a delay of %v, due %v after its first claim", key, retryDelay, ct.Due.Sub(f))
			}
			if w.kind == kAbandon && !ct.Due.After(f) {
				t.Errorf("%s reaped and due %v after its first claim, before its lease ran out", key, ct.Due.Sub(f))
			}
			err = dq.Complete(ctx, ct.Queue, ct.ID, ct.Token)
			finished.Add(1)
		default:
			t.Errorf("%s (kind %d) claimed for attempt %d", key, w.kind, ct.Attempt)
		}
		if err != nil {
			t.Errorf("%s attempt %d: %v", key, ct.Attempt, err)
		}
	}

	var wg sync.WaitGroup
	for c := range 6 {
		wg.Go(func() {
			for i := c; finished.Load() < int64(total) && ctx.Err() == nil; {
				got := 0
				for range queues {
					q := queues[i%len(queues)]
					i++
					cl, err := dq.Claim(ctx, q, 8, lease)
					if err != nil {
						if ctx.Err() == nil {
							t.Errorf("claim %s: %v", q, err)
						}
						return
					}
					for _, ct := range cl.Tasks {
						claimOne(ct, cl.Now)
					}
					got += len(cl.Tasks)
				}
				if got == 0 {
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	wg.Go(func() { // the reaper
		for finished.Load() < int64(total) && ctx.Err() == nil {
			for _, q := range queues {
				res, err := dq.Reap(ctx, q, 100)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("reap %s: %v", q, err)
					}
					return
				}
				for _, id := range res.Requeued {
					reaped.add(q + "/" + id)
				}
				if len(res.Exhausted)+len(res.Orphans) > 0 {
					t.Errorf("reap %s: exhausted %v orphans %v", q, res.Exhausted, res.Orphans)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	wg.Wait()
	if n := finished.Load(); n != int64(total) {
		t.Fatalf("%d of %d tasks finished: %v", n, total, ctx.Err())
	}

	// Every run claimed once: one run per task, two for retried and abandoned ones.
	if got, want := len(claims.snapshot()), total+nTwice; got != want {
		t.Errorf("%d runs claimed, want %d", got, want)
	}
	r := reaped.snapshot()
	for key, w := range tasks {
		if (w.kind == kAbandon) != (r[key] == 1) {
			t.Errorf("%s (kind %d) reaped %d times", key, w.kind, r[key])
		}
	}
	if s := stats(t, dq, queues); s.Ready != 0 || s.Active != 0 || s.Dead != int64(nKill) {
		t.Errorf("stats %+v, want nothing ready or active and %d dead", s, nKill)
	}
	for _, b := range batches {
		ids := make([]string, len(b.Tasks))
		for i, tk := range b.Tasks {
			ids[i] = tk.ID
		}
		infos, err := dq.Inspect(ctx, b.Queue, ids...)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range infos {
			want := dispatch.StateMissing // acknowledged: no done record by default
			if tasks[b.Queue+"/"+in.ID].kind == kKill {
				want = dispatch.StateDead
			}
			if in.State != want {
				t.Errorf("%s/%s: %s, want %s", b.Queue, in.ID, in.State, want)
			}
		}
	}
	t.Logf("%d tasks on %d queues, %d runs, %d reaped, %d dead", total, len(queues), total+nTwice, len(r), nKill)
}

// testWaiter: one Waiter (one pub/sub connection, on whichever node) gets the
// wake-ups that the enqueue script publishes on every master.
func testWaiter(t *testing.T, rdb *redis.ClusterClient, queues []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A long MaxWait: a wait that ends early ended by a wake-up.
	dq := newDQ(t, rdb, testenv.ClusterPrefix(t, rdb), time.Minute)
	w := dq.NewWaiter()
	defer w.Close()

	control := queues[0] // nothing is enqueued there: its wait runs its full time
	marks := map[string]dispatch.Mark{}
	for _, q := range queues {
		m, err := w.Mark(ctx, q)
		if err != nil {
			t.Fatalf("mark %s: %v", q, err)
		}
		cl, err := dq.Claim(ctx, q, 1, time.Second)
		if err != nil || len(cl.Tasks) != 0 || cl.NextDue != -1 {
			t.Fatalf("claim %s on an empty queue: %+v, %v", q, cl, err)
		}
		marks[q] = m
	}
	type result struct {
		q       string
		elapsed time.Duration
		err     error
	}
	results := make(chan result, len(queues))
	start := time.Now()
	for _, q := range queues {
		go func() {
			d := time.Duration(-1) // empty queue: until woken (or MaxWait)
			if q == control {
				d = 1500 * time.Millisecond
			}
			err := w.Wait(ctx, marks[q], d)
			results <- result{q, time.Since(start), err}
		}()
	}
	// Each queue gets a task due in an hour: still the new earliest task of its
	// empty queue, so the script publishes a wake-up.
	var batches []dispatch.QueueTasks
	for _, q := range queues[1:] {
		batches = append(batches, dispatch.QueueTasks{Queue: q, Tasks: []dispatch.Task{{ID: "x", RunAt: time.Now().Add(time.Hour)}}})
	}
	if _, err := dq.EnqueuePipelined(ctx, batches); err != nil {
		t.Fatal(err)
	}
	var slowest time.Duration
	for range queues {
		r := <-results
		switch {
		case r.err != nil:
			t.Errorf("wait %s: %v", r.q, r.err)
		case r.q == control && r.elapsed < 1400*time.Millisecond:
			t.Errorf("wait on %s, where nothing was enqueued, ended after %v", r.q, r.elapsed)
		case r.q != control && r.elapsed > 10*time.Second:
			t.Errorf("wait on %s woken after %v", r.q, r.elapsed)
		case r.q != control:
			slowest = max(slowest, r.elapsed)
		}
	}
	t.Logf("%d waits woken across the cluster, the last after %v", len(queues)-1, slowest)
}

// testRelay: two relays move 5,000 outbox rows of 50 queues to the cluster in
// pipelined rounds (each round spans every node); rows put back to pending, as
// after a relay crash between the Redis write and the commit, come again as
// duplicates and change nothing.
func testRelay(t *testing.T, rdb *redis.ClusterClient, queues []string) {
	const perQueue = 100
	pg := newPG(t)
	dq := newDQ(t, rdb, testenv.ClusterPrefix(t, rdb), 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	now := time.Now()
	var tasks []outbox.Task
	for i := range perQueue {
		for qi, q := range queues {
			tasks = append(tasks, outbox.Task{Queue: q, ID: fmt.Sprintf("r%03d", i), Payload: fmt.Appendf(nil, "%s/%d", q, i),
				RunAt: now.Add(time.Minute + time.Duration(i*50+qi)*time.Millisecond)})
		}
	}
	pg.produce(t, tasks, 500)
	cfg := relay.Config{BatchSize: 500, PollInterval: time.Second, ReapInterval: -1, StatsInterval: -1, Retention: -1,
		BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond}
	start := time.Now()
	runRelay(t, pg.url, dq, cfg)
	runRelay(t, pg.url, dq, cfg)
	waitQueued := func() {
		eventually(t, 60*time.Second, func() (bool, string) {
			s := pg.states(t)
			return s["queued"] == len(tasks), fmt.Sprint(s)
		})
	}
	waitQueued()
	t.Logf("%d rows of %d queues relayed in %v", len(tasks), len(queues), time.Since(start).Round(time.Millisecond))

	check := func() {
		t.Helper()
		for _, q := range queues {
			s, err := dq.Stats(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if s.Ready != perQueue || s.Active != 0 {
				t.Errorf("%s: %d ready, %d active, want %d ready", q, s.Ready, s.Active, perQueue)
			}
		}
		byQueue := map[string][]outbox.Task{}
		for _, tk := range tasks {
			byQueue[tk.Queue] = append(byQueue[tk.Queue], tk)
		}
		for q, ts := range byQueue {
			ids := make([]string, len(ts))
			for i, tk := range ts {
				ids[i] = tk.ID
			}
			infos, err := dq.Inspect(ctx, q, ids...)
			if err != nil {
				t.Fatal(err)
			}
			for i, in := range infos {
				if in.State != dispatch.StateReady || string(in.Payload) != string(ts[i].Payload) || in.Version != 1 ||
					!in.Score.Equal(ceilMilli(ts[i].RunAt)) {
					t.Errorf("%s/%s: %+v, want ready at %v with payload %q", q, in.ID, in, ts[i].RunAt, ts[i].Payload)
				}
			}
		}
	}
	check()

	// As if relays had written Redis and crashed before their commit: all rows
	// pending again. The next rounds find every task in Redis already.
	if _, err := pg.pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'pending', queued_at = NULL`); err != nil {
		t.Fatal(err)
	}
	waitQueued()
	check()
}

// testWorker: producers, a relay and two workers with transactional handlers on
// 50 queues: every task's effect is applied exactly once, none early, failures
// retried, tasks out of attempts dead in both stores. The workers sleep on empty
// queues with a MaxWait of a minute, so tasks only run in time if the wake-ups
// (PUBLISH in the scripts, SUBSCRIBE in the Waiter) work on the cluster.
func testWorker(t *testing.T, rdb *redis.ClusterClient, queues []string) {
	const perQueue = 30
	pg := newPG(t)
	dq := newDQ(t, rdb, testenv.ClusterPrefix(t, rdb), time.Minute)

	failFirst := func(i int) bool { return i%10 == 3 }
	alwaysFail := func(i int) bool { return i%25 == 7 }
	var tasks []outbox.Task
	nDead := 0
	for i := range perQueue {
		for _, q := range queues {
			tk := outbox.Task{Queue: q, ID: fmt.Sprintf("w%03d", i), Payload: []byte{byte(i)},
				Delay: time.Duration(i%20) * 100 * time.Millisecond}
			if alwaysFail(i) {
				tk.MaxAttempts = 1
				nDead++
			}
			tasks = append(tasks, tk)
		}
	}
	handler := func(name string) func(context.Context, pgx.Tx, *delayq.Task) error {
		return func(ctx context.Context, tx pgx.Tx, tk *delayq.Task) error {
			if err := effect(ctx, tx, name, tk); err != nil {
				return err
			}
			i := int(tk.Payload[0])
			if alwaysFail(i) || (failFirst(i) && tk.Attempt == 1) {
				return errInjected // rolls the effect back
			}
			return nil
		}
	}
	var workers []*delayq.Client
	for _, name := range []string{"w1", "w2"} {
		// 50 queues × 2 handlers share 16 connections: a handler waits for one
		// while its heartbeats keep the lease.
		w, err := clientkit.NewClient(pg.workerPool(t), dq, pg.ob, delayq.WorkerConfig{
			ErrorPause: 100 * time.Millisecond, ShutdownTimeout: 5 * time.Second, Logger: testLogger(t, name)})
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range queues {
			if err := w.HandleTx(q, handler(name), delayq.QueueConfig{Concurrency: 2,
				Backoff: delayq.Backoff{Base: 50 * time.Millisecond, Max: 100 * time.Millisecond}}); err != nil {
				t.Fatal(err)
			}
		}
		background(t, name, w.Run)
		workers = append(workers, w)
	}
	runRelay(t, pg.url, dq, relay.Config{PollInterval: time.Second, ReapInterval: 200 * time.Millisecond,
		StatsInterval: -1, Retention: -1, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	// Both workers have subscribed to the wake-ups of every queue (and claimed
	// nothing) before the first task arrives.
	waitSubscribed(t, rdb, dq, queues, 2)
	start := time.Now()
	pg.produce(t, tasks, 100)
	eventually(t, 60*time.Second, func() (bool, string) {
		s := pg.states(t)
		return s["done"] == len(tasks)-nDead && s["dead"] == nDead, fmt.Sprint(s)
	})
	elapsed := time.Since(start)
	pg.checkEffects(t)
	// A failed run's effect is rolled back: tasks failing their first run have
	// their effect from a later one. (Payloads are kept: ClearPayload is off.)
	if n := pg.count(t, `SELECT count(*) FROM effects e JOIN delayq_outbox o USING (queue, task_id)
		WHERE get_byte(o.payload, 0) % 10 = 3 AND e.attempt = 1`); n > 0 {
		t.Errorf("%d effects of a run that failed", n)
	}
	// Redis hears of each finished run after Postgres has committed it: a run done
	// in Postgres can be a few milliseconds from its ack. Two seconds is well inside
	// the 5 s lease, so an ack that was lost (and the reaper would repair) fails.
	eventually(t, 2*time.Second, func() (bool, string) {
		s := stats(t, dq, queues)
		return s.Dead == int64(nDead) && s.Ready == 0 && s.Active == 0,
			fmt.Sprintf("Redis: %+v, want %d dead and nothing ready or active", s, nDead)
	})
	var lateMS float64
	if err := pg.pool.QueryRow(context.Background(),
		`SELECT COALESCE(max(extract(epoch FROM claimed_at - due) * 1000), 0) FROM effects`).Scan(&lateMS); err != nil {
		t.Fatal(err)
	}
	if lateMS > 15000 {
		t.Errorf("a task was claimed %.0fms after it was due: wake-ups missed", lateMS)
	}
	var st [2]delayq.RunStats
	for i, w := range workers {
		st[i] = w.RunStats()
	}
	t.Logf("%d tasks (%d dead) on %d queues in %v, max claim lateness %.0fms; workers: %+v / %+v",
		len(tasks), nDead, len(queues), elapsed.Round(time.Millisecond), lateMS, st[0], st[1])
	if st[0].Claimed == 0 || st[1].Claimed == 0 {
		t.Errorf("a worker claimed nothing: %+v / %+v", st[0], st[1])
	}
}

// testSlotMigration: while the slot of a queue moves to another master, every
// script of the queue is refused with TRYAGAIN — its declared keys are not all on
// one node, and one of them, the task key prefix, is never a key — so none runs
// on half a queue; once the slot has moved, the queue works on its new master with
// nothing lost. (The queue has a slot of its own: the other subtests go on.)
func testSlotMigration(t *testing.T, rdb *redis.ClusterClient, cl *tempserver.RedisCluster, queues []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const q = "moving"
	dq := newDQ(t, rdb, testenv.ClusterPrefix(t, rdb), time.Minute)
	k, err := dq.Keys(q)
	if err != nil {
		t.Fatal(err)
	}
	slot := tempserver.Slot(k.Ready)
	for _, other := range queues {
		if tempserver.Slot("{"+other+"}") == slot {
			t.Fatalf("queue %s shares slot %d with %s", q, slot, other)
		}
	}
	var tasks []dispatch.Task
	for i := range 10 {
		tasks = append(tasks, dispatch.Task{ID: fmt.Sprintf("m%d", i)})
	}
	if _, err := dq.Enqueue(ctx, q, tasks...); err != nil {
		t.Fatal(err)
	}
	from, err := cl.MasterFor(ctx, k.Ready)
	if err != nil {
		t.Fatal(err)
	}
	masters, err := cl.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	to := masters[0]
	if to == from {
		to = masters[1]
	}
	mv, err := cl.BeginSlotMove(ctx, slot, to)
	if err != nil || mv == nil {
		t.Fatalf("begin slot move: %v", err)
	}
	defer mv.Close()
	tryAgain := func(when string) {
		t.Helper()
		_, err := dq.Claim(ctx, q, 100, time.Minute)
		if err == nil || !strings.Contains(err.Error(), "TRYAGAIN") {
			t.Errorf("claim %s: %v, want TRYAGAIN", when, err)
		}
		_, err = dq.Enqueue(ctx, q, dispatch.Task{ID: "late"})
		if err == nil || !strings.Contains(err.Error(), "TRYAGAIN") {
			t.Errorf("enqueue %s: %v, want TRYAGAIN", when, err)
		}
	}
	tryAgain("with the slot migrating, no key moved")
	if n, err := mv.MigrateKeys(ctx, 3); err != nil || n != 3 {
		t.Fatalf("migrate 3 keys: %d, %v", n, err)
	}
	tryAgain("with 3 keys moved")
	for {
		n, err := mv.MigrateKeys(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	if err := mv.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if m, err := cl.MasterFor(ctx, k.Ready); err != nil || m != to {
		t.Fatalf("after the move the queue is on %v (%v), want %s", m, err, to.Addr())
	}
	// Nothing ran during the move: every task is claimed now, at its first run,
	// and the refused enqueue left nothing behind.
	infos, err := dq.Inspect(ctx, q, "late")
	if err != nil || infos[0].State != dispatch.StateMissing {
		t.Errorf("refused enqueue: %+v, %v", infos, err)
	}
	cl2, err := dq.Claim(ctx, q, 100, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(cl2.Tasks) != len(tasks) {
		t.Errorf("%d tasks claimed after the move, want %d", len(cl2.Tasks), len(tasks))
	}
	for _, ct := range cl2.Tasks {
		if ct.Attempt != 1 {
			t.Errorf("%s claimed at attempt %d", ct.ID, ct.Attempt)
		}
		if err := dq.Complete(ctx, q, ct.ID, ct.Token); err != nil {
			t.Error(err)
		}
	}
	t.Logf("queue %s (slot %d, %d tasks) moved from %s to %s; its scripts were refused with TRYAGAIN meanwhile",
		q, slot, len(tasks), from.Addr(), to.Addr())
}

// ceilMilli is the due time a task enqueued through the outbox gets in Redis: the
// outbox keeps microseconds (pgx drops the nanoseconds), and the relay rounds that
// up to the millisecond. Ceiling t itself would be 1 ms off whenever its
// nanoseconds past the millisecond are under 1,000.
func ceilMilli(t time.Time) time.Time {
	t = t.Truncate(time.Microsecond)
	if c := t.Truncate(time.Millisecond); c.Before(t) {
		return c.Add(time.Millisecond)
	}
	return t
}
