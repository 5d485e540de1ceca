package transition_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/internal/transition"
	"github.com/delayq/delayq/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type bundle struct {
	pool *pgxpool.Pool
	dq   *dispatch.Client
	ob   *outbox.Client
	ops  *transition.Ops
}

func setup(t *testing.T) bundle {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store := taskstate.New(taskstate.Config{Schema: ob.Config().Schema, NotifyChannel: ob.Config().NotifyChannel})
	return bundle{pool: testenv.Postgres(t), dq: dq, ob: ob, ops: transition.New(store, dq)}
}

// claimed enqueues queue/id due now, moves it with the relay's operations and
// claims it.
func (b bundle) claimed(t *testing.T, queue, id string) transition.Claim {
	t.Helper()
	ctx := t.Context()
	if _, err := b.ob.Enqueue(ctx, b.pool, outbox.Task{Queue: queue, ID: id}); err != nil {
		t.Fatal(err)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := b.ops.TakeDue(ctx, tx, transition.Take{Horizon: time.Second, Limit: 10, Queues: []string{queue}, Shards: true})
	if err != nil || len(rows) != 1 {
		t.Fatalf("take due: %d rows, %v", len(rows), err)
	}
	st, err := b.ops.Move(ctx, tx, []dispatch.QueueTasks{{Queue: queue, Shards: rows[0].Shards, Tasks: []dispatch.Task{rows[0].Task()}}})
	if err != nil || st[0][0] != dispatch.Added {
		t.Fatalf("move: %v, %v", st, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := b.dq.Claim(ctx, queue, 1, time.Minute)
	if err != nil || len(c.Tasks) != 1 {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	ct := c.Tasks[0]
	return transition.Claim{Key: taskstate.Key{Queue: queue, ID: id, Version: ct.Version}, Token: ct.Token}
}

func (b bundle) redisState(t *testing.T, queue, id string) dispatch.State {
	t.Helper()
	infos, err := b.dq.Inspect(t.Context(), queue, id)
	if err != nil {
		t.Fatal(err)
	}
	return infos[0].State
}

// A death the row refuses (rescheduled meanwhile: another version) is written
// nowhere: Redis keeps the run's copy active, and BeforeRedis is not called.
func TestRefusedTransitionLeavesRedis(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	c := b.claimed(t, "q", "a")
	if ok, err := b.ops.Reschedule(ctx, b.pool, "q", "a", time.Now().Add(time.Hour)); !ok || err != nil {
		t.Fatalf("reschedule: %v, %v", ok, err)
	}
	called := false
	c.BeforeRedis = func() { called = true }
	res, err := b.ops.Kill(ctx, b.pool, c, transition.Failure{Attempt: 1, Err: "boom"})
	if err != nil || res.Applied || called {
		t.Fatalf("kill of an older version: %+v, %v, BeforeRedis called %v", res, err, called)
	}
	if st := b.redisState(t, "q", "a"); st != dispatch.StateActive {
		t.Fatalf("Redis holds the run's copy %s, want active", st)
	}
	// The row's own version dies in both stores, Postgres first.
	c2 := c
	c2.BeforeRedis = func() {
		called = true
		row, err := b.ops.Store().Row(ctx, b.pool, "q", "a")
		if err != nil || row.State != taskstate.Dead {
			t.Errorf("before the Redis write the row is %+v (%v), want dead", row, err)
		}
	}
	if _, err := b.pool.Exec(ctx, `UPDATE delayq_outbox SET version = $1 WHERE task_id = 'a'`, c.Version); err != nil {
		t.Fatal(err)
	}
	res, err = b.ops.Kill(ctx, b.pool, c2, transition.Failure{Attempt: 1, Err: "boom"})
	if err != nil || !res.Applied || res.RedisErr != nil || !called {
		t.Fatalf("kill: %+v, %v, BeforeRedis called %v", res, err, called)
	}
	if st := b.redisState(t, "q", "a"); st != dispatch.StateDead {
		t.Fatalf("Redis holds %s, want dead", st)
	}
}

// AckDone acknowledges only completions Postgres committed: the zero Done (a
// refusal) is skipped, and Redis keeps the task active.
func TestAckDoneTakesOnlyCommittedCompletions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	c := b.claimed(t, "q", "a")
	acked, err := b.ops.AckDone(ctx, []transition.Done{{}})
	if err != nil || len(acked) != 1 || acked[0] {
		t.Fatalf("ack of a refused completion: %v, %v", acked, err)
	}
	if st := b.redisState(t, "q", "a"); st != dispatch.StateActive {
		t.Fatalf("Redis holds %s, want active", st)
	}
	d, err := b.ops.MarkDone(ctx, b.pool, c, false)
	if err != nil || !d.OK() {
		t.Fatalf("mark done: %+v, %v", d, err)
	}
	// A second guard of the same run is refused: the zero Done.
	if d2, err := b.ops.MarkDone(ctx, b.pool, c, false); err != nil || d2.OK() {
		t.Fatalf("second mark done: %+v, %v", d2, err)
	}
	if acked, err := b.ops.AckDone(ctx, []transition.Done{d}); err != nil || !acked[0] {
		t.Fatalf("ack: %v, %v", acked, err)
	}
	// Done: the record stays for the done retention, or is gone.
	if st := b.redisState(t, "q", "a"); st != dispatch.StateDone && st != dispatch.StateMissing {
		t.Fatalf("Redis holds %s, want done", st)
	}
}

// RemoveFinished leaves a live task, and removes a cancelled one's copy.
func TestRemoveFinished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	b.claimed(t, "q", "a")
	if _, err := b.ops.RemoveFinished(ctx, b.pool, "q", "a"); !errors.Is(err, transition.ErrLive) {
		t.Fatalf("remove a live task: %v, want ErrLive", err)
	}
	if ok, err := b.ops.Cancel(ctx, b.pool, "q", "a"); !ok || err != nil {
		t.Fatalf("cancel: %v, %v", ok, err)
	}
	if removed, err := b.ops.RemoveFinished(ctx, b.pool, "q", "a"); !removed || err != nil {
		t.Fatalf("remove a cancelled task: %v, %v", removed, err)
	}
	if st := b.redisState(t, "q", "a"); st != dispatch.StateMissing {
		t.Fatalf("Redis holds %s, want missing", st)
	}
	if removed, err := b.ops.RemoveFinished(ctx, b.pool, "q", "a"); removed || err != nil {
		t.Fatalf("remove again: %v, %v", removed, err)
	}
}
