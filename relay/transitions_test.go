package relay_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// Regression tests of the transitions the relay owns (docs/DESIGN.md, "Transitions").

// A queued task rescheduled to a later time must not run at its old time: the relay
// replaces the old version in Redis at once, whether the new time lies beyond the
// horizon or inside it but beyond the notify window (no poll to wait for: the
// reschedule of a queued row notifies).
func TestRescheduleLaterReplacesTheOldVersionAtOnce(t *testing.T) {
	t.Parallel()
	for _, later := range []time.Duration{2 * time.Hour, 40 * time.Minute} {
		t.Run(later.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.start(t, relay.Config{PollInterval: time.Minute})
			b.enqueue(t, outbox.Task{Queue: "q", ID: "x", Payload: []byte("p"), Delay: 1500 * time.Millisecond})
			b.waitStates(t, 10*time.Second, map[string]int{"queued": 1})
			if ti := b.info(t, "q", "x"); ti.State != dispatch.StateReady || ti.Version != 1 {
				t.Fatalf("before the reschedule: %+v", ti)
			}
			runAt := time.Now().Add(later)
			if err := b.ob.Reschedule(ctxT(t), b.pool, "q", "x", runAt); err != nil {
				t.Fatal(err)
			}
			eventually(t, 5*time.Second, func() (bool, string) {
				ti := b.info(t, "q", "x")
				return ti.Version == 2, fmt.Sprintf("Redis holds %+v, want version 2", ti)
			})
			ti := b.info(t, "q", "x")
			if d := ti.Score.Sub(runAt); ti.State != dispatch.StateReady || d < -time.Millisecond || d > time.Millisecond {
				t.Errorf("version 2 in Redis: %+v, want ready at %v", ti, runAt)
			}
			// The relay's move writes Redis before it commits the row's state
			// (docs/DESIGN.md, "The write-order rule"): the row follows by a moment.
			eventually(t, 5*time.Second, func() (bool, string) {
				st := b.state(t, "q", "x")
				return st == "queued", fmt.Sprintf("outbox state %s, want queued", st)
			})
		})
	}
}

// A task id reused after retention pruned its finished row is a new task: the
// relay's enqueue replaces the done record an earlier life left in Redis (here with
// a done retention, the worst case) instead of taking it for a duplicate.
func TestReusedIDAfterPruneRuns(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	b := newBundle(t, rdb, prefix)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix, DoneRetention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	b.startDQ(t, dq, relay.Config{})
	b.enqueue(t, task("q", "x"))
	b.waitStates(t, 10*time.Second, map[string]int{"queued": 1})
	cl := claimWhenDue(ctxT(t), t, dq, "q")
	if len(cl.Tasks) != 1 || !markDone(t, b.pool, "q", "x", 1) {
		t.Fatalf("first life: claimed %+v", cl.Tasks)
	}
	if err := dq.Complete(ctxT(t), "q", "x", cl.Tasks[0].Token); err != nil {
		t.Fatal(err)
	}
	if ti := b.info(t, "q", "x"); ti.State != dispatch.StateDone {
		t.Fatalf("first life in Redis: %+v, want its done record", ti)
	}
	// Retention deletes the finished row; the id is free again.
	if _, err := b.pool.Exec(ctxT(t), `DELETE FROM delayq_outbox WHERE queue = 'q' AND task_id = 'x'`); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, task("q", "x"))
	b.waitStates(t, 10*time.Second, map[string]int{"queued": 1})
	if ti := b.info(t, "q", "x"); ti.State != dispatch.StateReady || ti.Version != 1 {
		t.Fatalf("second life in Redis: %+v, want ready", ti)
	}
	if cl := claimWhenDue(ctxT(t), t, dq, "q"); len(cl.Tasks) != 1 || cl.Tasks[0].ID != "x" {
		t.Errorf("second life claimed %+v", cl.Tasks)
	}
}

// The reaper visits a queue the relay never moved a row of (a task enqueued into
// Redis directly: the queue registry knows it), so its expired leases do not wait
// for reconcile.
func TestReaperVisitsEveryRegisteredQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	if _, err := b.dq.Enqueue(ctx, "idle", dispatch.Task{ID: "x", Payload: []byte("p"), MaxAttempts: 3}); err != nil {
		t.Fatal(err)
	}
	cl := claimWhenDue(ctx, t, b.dq, "idle")
	if len(cl.Tasks) != 1 {
		t.Fatalf("claimed %+v", cl.Tasks)
	}
	k, _ := b.dq.Keys("idle")
	b.rdb.ZAdd(ctx, k.Active, redis.Z{Member: "x", Score: 1}) // the lease ran out
	b.start(t, relay.Config{ReapInterval: 20 * time.Millisecond})
	eventually(t, 10*time.Second, func() (bool, string) {
		ti := b.info(t, "idle", "x")
		return ti.State == dispatch.StateReady, fmt.Sprintf("idle/x in Redis: %+v, want requeued", ti)
	})
}

// A task out of attempts whose reaping was interrupted before Postgres heard of it
// (a relay killed after the reap) is found again and settled by the next relay:
// dead in Postgres first, then in Redis. Nothing was kept only in memory.
func TestReaperSettlesAfterARestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	b.enqueue(t, outbox.Task{Queue: "q", ID: "x", Payload: []byte("p"), MaxAttempts: 1})
	b.start(t, relay.Config{ReapInterval: -1})
	b.waitStates(t, 10*time.Second, map[string]int{"queued": 1})
	cl := claimWhenDue(ctx, t, b.dq, "q")
	if len(cl.Tasks) != 1 {
		t.Fatalf("claimed %+v", cl.Tasks)
	}
	k, _ := b.dq.Keys("q")
	b.rdb.ZAdd(ctx, k.Active, redis.Z{Member: "x", Score: 1})
	// The reap of a relay that dies before it settles anything.
	if res, err := b.dq.Reap(ctx, "q", 10); err != nil || len(res.Exhausted) != 1 {
		t.Fatalf("reap: %+v %v", res, err)
	}
	if st := b.state(t, "q", "x"); st != "queued" {
		t.Fatalf("outbox state %s after the interrupted reap", st)
	}
	b.rdb.ZAdd(ctx, k.Active, redis.Z{Member: "x", Score: 1}) // its hold ran out
	b.start(t, relay.Config{ReapInterval: 20 * time.Millisecond})
	eventually(t, 10*time.Second, func() (bool, string) {
		st := b.state(t, "q", "x")
		return st == "dead", "outbox state " + st
	})
	eventually(t, 5*time.Second, func() (bool, string) {
		ti := b.info(t, "q", "x")
		return ti.State == dispatch.StateDead && ti.LastError == dispatch.LeaseExpiredError, fmt.Sprintf("Redis holds %+v", ti)
	})
}
