package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
)

// scenario writes one task of every kind of inconsistency (and consistent ones
// around them) into queue "q", and returns the expected kind of each
// inconsistent id.
func (b testBundle) scenario(t *testing.T) map[string]Kind {
	t.Helper()
	now := b.redisNow(t)
	past := float64(now.Add(-time.Minute).UnixMilli()) / 1000
	future := float64(now.Add(time.Hour).UnixMilli()) / 1000
	old := float64(now.Add(-time.Hour).UnixMilli()) / 1000
	b.insertRows(t,
		pgRow{queue: "q", id: "ok-queued", state: stateQueued},
		pgRow{queue: "q", id: "ok-pending", state: statePending, runAt: now.Add(time.Hour)},
		pgRow{queue: "q", id: "ok-done", state: stateDone},
		pgRow{queue: "q", id: "ok-done-gone", state: stateDone},
		pgRow{queue: "q", id: "ok-dead", state: stateDead, attempt: 5, lastError: "boom"},
		pgRow{queue: "q", id: "ok-active", state: stateQueued, attempt: 1},
		pgRow{queue: "q", id: "expired", state: stateQueued, attempt: 1},
		pgRow{queue: "q", id: "missing", state: stateQueued, attempt: 2, version: 3},
		pgRow{queue: "q", id: "nomember", state: stateQueued},
		pgRow{queue: "q", id: "nohash", state: stateQueued},
		pgRow{queue: "q", id: "mismatch-r", state: stateQueued},
		pgRow{queue: "q", id: "mismatch-a", state: stateQueued, attempt: 1},
		pgRow{queue: "q", id: "version", state: stateQueued, version: 2},
		pgRow{queue: "q", id: "doneredis", state: stateQueued},
		pgRow{queue: "q", id: "deadredis", state: stateQueued, attempt: 1},
		pgRow{queue: "q", id: "deadpg", state: stateDead, attempt: 5},
		pgRow{queue: "q", id: "finished", state: stateDone},
		pgRow{queue: "q", id: "cancelled", state: stateCancelled},
		pgRow{queue: "q", id: "pending-broken", state: statePending, runAt: now.Add(time.Hour)},
	)
	b.putRedis(t,
		redisTask{queue: "q", id: "ok-queued", status: "r", sets: map[string]float64{"ready": past}},
		redisTask{queue: "q", id: "ok-done", status: "d"},
		redisTask{queue: "q", id: "ok-dead", status: "x", attempt: 5, sets: map[string]float64{"dead": old}},
		redisTask{queue: "q", id: "ok-active", status: "a", attempt: 1, token: "tok.1", sets: map[string]float64{"active": future}},
		redisTask{queue: "q", id: "expired", status: "a", attempt: 1, token: "tok.2", sets: map[string]float64{"active": old}},
		redisTask{queue: "q", id: "nomember", status: "r"},
		redisTask{queue: "q", id: "nohash", sets: map[string]float64{"ready": past}},
		redisTask{queue: "q", id: "mismatch-r", status: "r", sets: map[string]float64{"active": future}},
		redisTask{queue: "q", id: "mismatch-a", status: "a", attempt: 1, sets: map[string]float64{"ready": past}},
		redisTask{queue: "q", id: "version", status: "r", version: 1, sets: map[string]float64{"ready": future}},
		redisTask{queue: "q", id: "doneredis", status: "d"},
		redisTask{queue: "q", id: "deadredis", status: "x", attempt: 1, sets: map[string]float64{"dead": old}},
		redisTask{queue: "q", id: "deadpg", status: "r", sets: map[string]float64{"ready": past}},
		redisTask{queue: "q", id: "finished", status: "r", sets: map[string]float64{"ready": past}},
		redisTask{queue: "q", id: "cancelled", status: "a", token: "tok.3", sets: map[string]float64{"active": future}},
		redisTask{queue: "q", id: "pending-broken", status: "r"},
		// No outbox row at all.
		redisTask{queue: "q", id: "orphan-ready", status: "r", sets: map[string]float64{"ready": past}},
		redisTask{queue: "q", id: "orphan-hash", status: "a"},
		redisTask{queue: "q", id: "orphan-member", sets: map[string]float64{"dead": old}},
		redisTask{queue: "q", id: "orphan-done", status: "d"},
		// A queue only Redis knows.
		redisTask{queue: "gone", id: "x", status: "r", sets: map[string]float64{"ready": past}},
	)
	return map[string]Kind{
		"q/missing":        MissingInRedis,
		"q/nomember":       HashWithoutMember,
		"q/nohash":         MemberWithoutHash,
		"q/mismatch-r":     StatusMismatch,
		"q/mismatch-a":     StatusMismatch,
		"q/version":        VersionMismatch,
		"q/doneredis":      DoneInRedis,
		"q/deadredis":      DeadInRedis,
		"q/deadpg":         DeadInPostgres,
		"q/finished":       FinishedInPostgres,
		"q/cancelled":      FinishedInPostgres,
		"q/pending-broken": HashWithoutMember,
		"q/orphan-ready":   UnknownInPostgres,
		"q/orphan-hash":    UnknownInPostgres,
		"q/orphan-member":  UnknownInPostgres,
		"gone/x":           UnknownInPostgres,
	}
}

func kindsOf(incs []Inconsistency) map[string]Kind {
	out := map[string]Kind{}
	for _, inc := range incs {
		out[inc.Queue+"/"+inc.ID] = inc.Kind
	}
	return out
}

func sameKinds(t *testing.T, what string, got, want map[string]Kind) {
	t.Helper()
	for id, k := range want {
		if got[id] != k {
			t.Errorf("%s: %s: kind %q, want %q", what, id, got[id], k)
		}
	}
	for id, k := range got {
		if _, ok := want[id]; !ok {
			t.Errorf("%s: %s: unexpected %q", what, id, k)
		}
	}
}

func TestCheckFindsEachKind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	want := b.scenario(t)
	// Deep: the scenario has a hash outside every ZSET and a queue only Redis
	// knows, which only a keyspace SCAN finds.
	incs, err := Check(ctx, b.pool, b.dq, Options{BatchSize: 3, Deep: true})
	if err != nil {
		t.Fatal(err)
	}
	sameKinds(t, "check", kindsOf(incs), want)
	if len(incs) != len(want) {
		t.Errorf("%d inconsistencies, want %d: %+v", len(incs), len(want), incs)
	}
	for _, inc := range incs {
		if inc.Queue == "q" && inc.ID == "nomember" && (inc.Postgres != "queued v1" || inc.Redis != "ready v1, in no ZSET") {
			t.Errorf("nomember described as %+v", inc)
		}
	}
	// One queue only.
	incs, err = Check(ctx, b.pool, b.dq, Options{Queues: []string{"gone"}})
	if err != nil {
		t.Fatal(err)
	}
	sameKinds(t, "check gone", kindsOf(incs), map[string]Kind{"gone/x": UnknownInPostgres})
}

func TestReconcileDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	want := b.scenario(t)
	before := b.dump(t)
	rep, err := Reconcile(ctx, b.pool, b.dq, Options{DryRun: true, BatchSize: 4, Deep: true})
	if err != nil {
		t.Fatal(err)
	}
	if after := b.dump(t); after != before {
		t.Errorf("dry run changed something:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if !rep.DryRun || rep.Repaired != 0 || rep.Found != len(want) {
		t.Errorf("report: dry %v, found %d (want %d), repaired %d", rep.DryRun, rep.Found, len(want), rep.Repaired)
	}
	counts := map[Kind]int{}
	for _, k := range want {
		counts[k]++
	}
	for _, k := range AllKinds() {
		if rep.Kinds[k].Found != counts[k] {
			t.Errorf("%s: found %d, want %d (samples %v)", k, rep.Kinds[k].Found, counts[k], rep.Kinds[k].Samples)
		}
	}
	// Left alone even by a real run: the pending row (the relay's) and the recent death.
	if b := rep.Kinds[HashWithoutMember]; b.Skipped != 1 {
		t.Errorf("hash_without_member skipped %d, want 1 (the pending row)", b.Skipped)
	}
	if rep.ExpiredLeases.Found != 1 || !slices.Equal(rep.ExpiredLeases.Samples, []string{"q/expired"}) {
		t.Errorf("expired leases %+v", rep.ExpiredLeases)
	}
	if !slices.Equal(rep.Queues, []string{"gone", "q"}) || rep.Rows != 19 || rep.RedisOnly != 5 {
		t.Errorf("queues %v, rows %d, redis-only %d", rep.Queues, rep.Rows, rep.RedisOnly)
	}
}

func TestReconcileRepairsEachKind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	want := b.scenario(t)
	var progress []Progress
	rep, err := Reconcile(ctx, b.pool, b.dq, Options{BatchSize: 5, Deep: true, Progress: func(p Progress) { progress = append(progress, p) }})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Found != len(want) || rep.Repaired != len(want)-1 || rep.Skipped != 1 {
		t.Errorf("found %d, repaired %d, skipped %d; want %d, %d, 1", rep.Found, rep.Repaired, rep.Skipped, len(want), len(want)-1)
	}
	if len(progress) == 0 || progress[len(progress)-1].Queue != "q" || progress[len(progress)-1].QueueIndex != 2 {
		t.Errorf("progress %+v", progress)
	}
	for _, p := range progress {
		if p.Phase == "postgres" && p.Queue == "q" && p.Total != 19 {
			t.Errorf("progress total %d, want 19", p.Total)
		}
	}

	// Only the pending row, the relay's, is still inconsistent.
	incs, err := Check(ctx, b.pool, b.dq, Options{})
	if err != nil {
		t.Fatal(err)
	}
	sameKinds(t, "check after", kindsOf(incs), map[string]Kind{"q/pending-broken": HashWithoutMember})

	// What each repair left.
	for id, st := range map[string]dispatch.State{
		"orphan-ready": dispatch.StateMissing, "orphan-hash": dispatch.StateMissing, "orphan-member": dispatch.StateMissing,
		"orphan-done": dispatch.StateDone, "ok-done": dispatch.StateDone, "ok-dead": dispatch.StateDead,
		"deadpg": dispatch.StateMissing, "finished": dispatch.StateMissing, "cancelled": dispatch.StateMissing,
		"expired": dispatch.StateActive, "mismatch-a": dispatch.StateActive,
	} {
		if p := b.probe(t, "q", id); p.State != st || !p.Consistent() {
			t.Errorf("%s: %+v, want %s", id, p, st)
		}
	}
	if p := b.probe(t, "q", "missing"); p.State != dispatch.StateReady || p.Attempt != 2 || p.Version != 3 || !p.InReady {
		t.Errorf("missing restored as %+v, want ready with attempt 2, version 3", p)
	}
	if p := b.probe(t, "q", "expired"); !p.ActiveScore.Before(b.redisNow(t)) {
		t.Errorf("expired lease was touched: %+v", p)
	}
	if p := b.probe(t, "q", "mismatch-a"); !p.InActive || p.InReady || !p.ActiveScore.Before(time.Unix(1, 0)) {
		t.Errorf("mismatch-a not handed to the reaper: %+v", p)
	}

	// Workers now run exactly the unfinished tasks, once each.
	r := newRuns()
	b.drain(t, ctx, []string{"q", "gone"}, r)
	got := r.snapshot()
	var ran []string
	for id, n := range got {
		ran = append(ran, id)
		if n != 1 {
			t.Errorf("%s ran %d times", id, n)
		}
	}
	sort.Strings(ran)
	wantRan := []string{"q/deadredis", "q/doneredis", "q/expired", "q/mismatch-a", "q/mismatch-r", "q/missing",
		"q/nohash", "q/nomember", "q/ok-active", "q/ok-queued", "q/version"}
	// ok-active holds a live lease of a minute: it is not due for anyone else.
	wantRan = slices.DeleteFunc(wantRan, func(s string) bool { return s == "q/ok-active" })
	if !slices.Equal(ran, wantRan) {
		t.Errorf("ran %v\nwant %v", ran, wantRan)
	}
	if r.attempt["q/missing"] != 3 || r.version["q/version"] != 2 {
		t.Errorf("missing ran as attempt %d (want 3), version ran as v%d (want 2)", r.attempt["q/missing"], r.version["q/version"])
	}
	for id, n := range b.effects(t) {
		if n != 1 {
			t.Errorf("effect of %s applied %d times", id, n)
		}
	}

	// A second run finds nothing new.
	rep, err = Reconcile(ctx, b.pool, b.dq, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Found != 1 || rep.Kinds[HashWithoutMember].Skipped != 1 {
		t.Errorf("second run: %+v", rep)
	}
}

// TestReconcileAfterFlushAll is the disaster the design promises to survive: Redis
// loses everything; reconcile rebuilds it from Postgres; every unfinished task runs
// exactly once and no finished one again.
func TestReconcileAfterFlushAll(t *testing.T) {
	t.Parallel()
	b := setupOwnRedis(t)
	ctx := ctxT(t, 5*time.Minute)
	n := 20000 // several scan pages and write batches per queue
	if testing.Short() {
		n = 2000
	}
	queues := []string{"emails", "payments"}
	var rows []pgRow
	unfinished := map[string]bool{}
	var queued []dispatch.Task
	var queuedQ []string
	for i := range n {
		q := queues[i%2]
		r := pgRow{queue: q, id: fmt.Sprintf("task-%05d", i), maxAttempts: 5}
		switch i % 10 {
		case 0, 1:
			r.state = statePending
		case 2, 3, 4, 5:
			r.state = stateQueued
			if i%20 == 2 {
				r.attempt = 2
			}
			if i%40 == 3 {
				r.version = 2
			}
		case 6, 7:
			r.state = stateDone
		case 8:
			r.state, r.attempt, r.lastError = stateDead, 5, "boom"
		case 9:
			r.state = stateCancelled
		}
		rows = append(rows, r)
		if r.state == statePending || r.state == stateQueued {
			unfinished[q+"/"+r.id] = true
		}
		if r.state == stateQueued {
			queued = append(queued, dispatch.Task{ID: r.id, Payload: []byte("p"), Attempt: r.attempt, Version: max(1, r.version), MaxAttempts: 5})
			queuedQ = append(queuedQ, q)
		}
	}
	for start := 0; start < len(rows); start += 2000 {
		b.insertRows(t, rows[start:min(start+2000, len(rows))]...)
	}
	byQueue := map[string][]dispatch.Task{}
	for i, task := range queued {
		byQueue[queuedQ[i]] = append(byQueue[queuedQ[i]], task)
	}
	for q, ts := range byQueue {
		if _, err := b.dq.Enqueue(ctx, q, ts...); err != nil {
			t.Fatal(err)
		}
	}
	if incs, err := Check(ctx, b.pool, b.dq, Options{}); err != nil || len(incs) != 0 {
		t.Fatalf("before the flush: %d inconsistencies (%v), first %+v", len(incs), err, incs[:min(1, len(incs))])
	}

	if err := b.rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep, err := Reconcile(ctx, b.pool, b.dq, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reconcile of %d rows after FLUSHALL: %v, %d repaired", rep.Rows, time.Since(start).Round(time.Millisecond), rep.Repaired)
	if rep.Rows != n || rep.Found != len(queued) || rep.Kinds[MissingInRedis].Repaired != len(queued) || rep.Skipped != 0 {
		t.Fatalf("report: rows %d, found %d, missing repaired %d, skipped %d; want %d, %d, %d, 0",
			rep.Rows, rep.Found, rep.Kinds[MissingInRedis].Repaired, rep.Skipped, n, len(queued), len(queued))
	}
	if incs, err := Check(ctx, b.pool, b.dq, Options{}); err != nil || len(incs) != 0 {
		t.Fatalf("after reconcile: %d inconsistencies (%v)", len(incs), err)
	}

	r := newRuns()
	start = time.Now()
	b.drain(t, ctx, queues, r)
	t.Logf("drained %d tasks in %v", len(r.snapshot()), time.Since(start).Round(time.Millisecond))
	got := r.snapshot()
	for id := range unfinished {
		if got[id] != 1 {
			t.Errorf("%s ran %d times, want once", id, got[id])
		}
	}
	for id, c := range got {
		if !unfinished[id] {
			t.Errorf("finished task %s ran %d times", id, c)
		}
	}
	effects := b.effects(t)
	if len(effects) != len(unfinished) {
		t.Errorf("%d effects, want %d", len(effects), len(unfinished))
	}
	for id, c := range effects {
		if c != 1 || !unfinished[id] {
			t.Errorf("effect of %s applied %d times", id, c)
		}
	}
	// Attempts and versions survived the loss.
	for i, task := range queued {
		key := queuedQ[i] + "/" + task.ID
		if r.attempt[key] != task.Attempt+1 || r.version[key] != task.Version {
			t.Errorf("%s ran as attempt %d v%d, want attempt %d v%d", key, r.attempt[key], r.version[key], task.Attempt+1, task.Version)
			break
		}
	}
}

// TestReconcileUnderLoad runs reconcile again and again while a producer, a relay
// and workers run and something keeps destroying parts of Redis: every task runs
// to completion and its effect is applied exactly once.
func TestReconcileUnderLoad(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, 3*time.Minute)
	const n, queue = 3000, "load"
	k := b.keys(t, queue)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 10)
	fail := func(err error) {
		if err != nil && ctx.Err() == nil {
			select {
			case errc <- err:
			default:
			}
			cancel()
		}
	}
	loop := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				fail(f())
			}
		}()
	}
	produced := make(chan struct{})
	wg.Add(1)
	go func() { // producer: batches of 50, some due now, some a little later
		defer wg.Done()
		defer close(produced)
		for i := 0; i < n && ctx.Err() == nil; i += 50 {
			var ts []outbox.Task
			for j := i; j < i+50; j++ {
				ts = append(ts, outbox.Task{Queue: queue, ID: fmt.Sprintf("L%05d", j), Delay: time.Duration(j%7) * 20 * time.Millisecond})
			}
			if _, err := b.ob.EnqueueMany(ctx, b.pool, ts); err != nil {
				fail(err)
				return
			}
		}
	}()
	loop(func() error {
		n, err := b.relayOnce(ctx)
		if n == 0 {
			pause(ctx, 5*time.Millisecond)
		}
		return err
	})
	r := newRuns()
	for range 3 {
		loop(func() error {
			n, err := b.workOnce(ctx, queue, r)
			if n == 0 {
				pause(ctx, 2*time.Millisecond)
			}
			return err
		})
	}
	var damaged atomic.Int64
	loop(func() error { // chaos: lose a hash, a member, or both, of random ready tasks
		ids, err := b.rdb.ZRandMember(ctx, k.Ready, 3).Result()
		if err != nil {
			return err
		}
		for i, id := range ids {
			switch (int(damaged.Load()) + i) % 3 {
			case 0:
				err = b.rdb.Del(ctx, k.TaskKey(id)).Err()
			case 1:
				err = b.rdb.ZRem(ctx, k.Ready, id).Err()
			default:
				err = b.rdb.Del(ctx, k.TaskKey(id)).Err()
				if err == nil {
					err = b.rdb.ZRem(ctx, k.Ready, id).Err()
				}
			}
			if err != nil {
				return err
			}
			damaged.Add(1)
		}
		pause(ctx, 5*time.Millisecond)
		return nil
	})
	var repaired, runsOfReconcile atomic.Int64
	loop(func() error {
		rep, err := Reconcile(ctx, b.pool, b.dq, Options{BatchSize: 200, Grace: -1})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		repaired.Add(int64(rep.Repaired))
		runsOfReconcile.Add(1)
		pause(ctx, 10*time.Millisecond)
		return nil
	})

	// Wait until every task is done in Postgres, then stop the chaos and settle.
	<-produced
	for ctx.Err() == nil {
		var left int
		if err := b.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE state <> 'done'`, b.table)).Scan(&left); err != nil {
			fail(err)
			break
		}
		if left == 0 {
			break
		}
		pause(ctx, 20*time.Millisecond)
	}
	stopped := ctx.Err() != nil
	cancel()
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatalf("load: %v", err)
	}
	if stopped {
		t.Fatal("not every task finished in time")
	}
	t.Logf("%d tasks, %d damaged, %d reconcile runs repaired %d", n, damaged.Load(), runsOfReconcile.Load(), repaired.Load())
	if damaged.Load() == 0 || repaired.Load() == 0 {
		t.Errorf("the test did not exercise reconcile: %d damaged, %d repaired", damaged.Load(), repaired.Load())
	}
	effects := b.effects(t)
	if len(effects) != n {
		t.Errorf("%d effects, want %d", len(effects), n)
	}
	for id, c := range effects {
		if c != 1 {
			t.Errorf("effect of %s applied %d times", id, c)
		}
	}
	// Once the load stops, one more run leaves Redis consistent with Postgres (a
	// task damaged while a worker held it may still need its leftovers removed).
	if _, err := Reconcile(context.Background(), b.pool, b.dq, Options{Grace: -1}); err != nil {
		t.Fatal(err)
	}
	incs, err := Check(context.Background(), b.pool, b.dq, Options{})
	if err != nil || len(incs) != 0 {
		t.Errorf("after the load: %v %+v", err, incs)
	}
}

// TestReconcileNeverRevivesACompletedTask completes a task between reconcile's
// first read and its repair: the task is not put back.
func TestReconcileNeverRevivesACompletedTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	b.insertRows(t, pgRow{queue: "q", id: "a", state: stateQueued}, pgRow{queue: "q", id: "b", state: stateQueued})
	// Redis lost both. Before reconcile decides, a worker (still holding "a" from
	// before the loss) completes it; "b" is locked by a worker in the middle of its
	// completion.
	var lockTx context.CancelFunc
	opts := Options{beforeSettle: func(q string, ids []string) {
		if !slices.Equal(ids, []string{"a", "b"}) {
			t.Errorf("candidates %v", ids)
		}
		if ok, err := b.guard.MarkDone(ctx, b.pool, taskstate.Key{Queue: "q", ID: "a", Version: 1}, false); err != nil || !ok {
			t.Errorf("MarkDone a: %v %v", ok, err)
		}
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := b.guard.MarkDone(ctx, tx, taskstate.Key{Queue: "q", ID: "b", Version: 1}, false); err != nil || !ok {
			t.Errorf("MarkDone b: %v %v", ok, err)
		}
		lockTx = func() { _ = tx.Commit(ctx) }
	}}
	rep, err := Reconcile(ctx, b.pool, b.dq, opts)
	if lockTx != nil {
		lockTx()
	}
	if err != nil {
		t.Fatal(err)
	}
	if rep.Repaired != 0 || rep.Kinds[MissingInRedis].Skipped != 1 || rep.Found != 1 {
		t.Errorf("report %+v, want b skipped as busy and a resolved", rep.Kinds[MissingInRedis])
	}
	for _, id := range []string{"a", "b"} {
		if p := b.probe(t, "q", id); p.State != dispatch.StateMissing || !p.Consistent() {
			t.Errorf("%s revived: %+v", id, p)
		}
	}
	rep, err = Reconcile(ctx, b.pool, b.dq, Options{})
	if err != nil || rep.Found != 0 {
		t.Errorf("second run: found %d, %v", rep.Found, err)
	}
}

// TestReconcileSkipsChangedTasks changes a task in Redis between reconcile's read
// and its repair: the compare-and-set leaves it alone.
func TestReconcileSkipsChangedTasks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	b.insertRows(t, pgRow{queue: "q", id: "a", state: stateQueued})
	b.putRedis(t, redisTask{queue: "q", id: "a", status: "r"}) // lost its member
	k := b.keys(t, "q")
	calls := 0
	rep, err := Reconcile(ctx, b.pool, b.dq, Options{beforeSettle: func(string, []string) {
		calls++
		// A concurrent repair by someone else, e.g. a relay's duplicate enqueue.
		if err := b.rdb.ZAdd(ctx, k.Ready, redisZ("a", 1)).Err(); err != nil {
			t.Fatal(err)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 1 || rep.Found != 0 {
		t.Errorf("calls %d, report %+v: the task was consistent at the second read", calls, rep.Kinds)
	}
}

func TestReconcileGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	now := float64(b.redisNow(t).UnixMilli()) / 1000
	b.insertRows(t, pgRow{queue: "q", id: "a", state: stateQueued, attempt: 4})
	b.putRedis(t, redisTask{queue: "q", id: "a", status: "x", attempt: 5, sets: map[string]float64{"dead": now}})
	rep, err := Reconcile(ctx, b.pool, b.dq, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if k := rep.Kinds[DeadInRedis]; k.Found != 1 || k.Skipped != 1 || k.Repaired != 0 {
		t.Errorf("a fresh death: %+v, want skipped", k)
	}
	rep, err = Reconcile(ctx, b.pool, b.dq, Options{Grace: -1})
	if err != nil {
		t.Fatal(err)
	}
	if k := rep.Kinds[DeadInRedis]; k.Repaired != 1 {
		t.Errorf("no grace: %+v, want repaired", k)
	}
	// Postgres wins: ready again, its attempts as Postgres counts them (at most
	// max-1, so it gets a run).
	if p := b.probe(t, "q", "a"); p.State != dispatch.StateReady || p.Attempt != 4 || !p.Consistent() {
		t.Errorf("requeued as %+v", p)
	}
}

func TestOptions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	for _, o := range []Options{
		{BatchSize: 1001}, {BatchSize: -1}, {Grace: -2}, {Samples: -2},
		{Queues: []string{"a{b"}}, {Schema: "Bad-Schema"},
	} {
		if _, err := Reconcile(ctx, b.pool, b.dq, o); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("Reconcile(%+v): %v, want ErrInvalidOptions", o, err)
		}
		if _, err := Check(ctx, b.pool, b.dq, o); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("Check(%+v): %v", o, err)
		}
	}
	if _, err := Reconcile(ctx, nil, b.dq, Options{}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("nil db: %v", err)
	}
	o := Options{}.WithDefaults()
	if o.Schema != "public" || o.BatchSize != 500 || o.Grace != time.Minute || o.Samples != 10 || o.Logger == nil {
		t.Errorf("defaults %+v", o)
	}
}

func TestReportSamples(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	var rows []pgRow
	for i := range 30 {
		rows = append(rows, pgRow{queue: "q", id: fmt.Sprintf("m%02d", i), state: stateQueued})
	}
	b.insertRows(t, rows...)
	rep, err := Reconcile(ctx, b.pool, b.dq, Options{DryRun: true, Samples: 3})
	if err != nil {
		t.Fatal(err)
	}
	if k := rep.Kinds[MissingInRedis]; k.Found != 30 || !slices.Equal(k.Samples, []string{"q/m00", "q/m01", "q/m02"}) {
		t.Errorf("bucket %+v", k)
	}
	rep, err = Reconcile(ctx, b.pool, b.dq, Options{DryRun: true, Samples: -1})
	if err != nil || len(rep.Kinds[MissingInRedis].Samples) != 0 {
		t.Errorf("samples -1: %v %v", rep.Kinds[MissingInRedis].Samples, err)
	}
}

// Reconcile, Check and Stats do not SCAN the keyspace by default: they walk the
// outbox, the queue registry and the queues' ZSETs, so their cost follows the
// queues, not the number of keys. Deep adds the SCAN.
func TestNoKeyspaceScanByDefault(t *testing.T) {
	t.Parallel()
	b := setupOwnRedis(t)
	rdb := b.rdb
	ctx := ctxT(t, time.Minute)
	b.insertRows(t, pgRow{queue: "q", id: "a", state: stateQueued}, pgRow{queue: "q", id: "b", state: stateQueued})
	if _, err := b.dq.Enqueue(ctx, "q", dispatch.Task{ID: "a"}); err != nil {
		t.Fatal(err)
	}
	scans := func() int64 {
		stats, err := rdb.InfoMap(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		calls := int64(0)
		if line, ok := stats["Commandstats"]["cmdstat_scan"]; ok {
			fmt.Sscanf(line, "calls=%d", &calls)
		}
		return calls
	}
	rep, err := Reconcile(ctx, b.pool, b.dq, Options{})
	if err != nil || rep.Kinds[MissingInRedis].Repaired != 1 {
		t.Fatalf("reconcile: %+v %v, want b restored", rep.Kinds[MissingInRedis], err)
	}
	if _, err := Check(ctx, b.pool, b.dq, Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := Stats(ctx, b.pool, b.dq, Options{}); err != nil {
		t.Fatal(err)
	}
	if n := scans(); n != 0 {
		t.Errorf("%d SCAN calls without Deep, want 0", n)
	}
	if _, err := Check(ctx, b.pool, b.dq, Options{Deep: true}); err != nil {
		t.Fatal(err)
	}
	if n := scans(); n == 0 {
		t.Errorf("no SCAN with Deep")
	}
}
