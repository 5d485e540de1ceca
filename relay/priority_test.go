package relay_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// A task's priority goes from the outbox to Redis with the relay (EnqueueMany and
// Enqueue), is kept by a reschedule and a retry from dead, and survives the loss
// of Redis: reconcile restores it from Postgres, and the due tasks are then
// claimed highest priority first.
func TestPriorityFromOutboxToRedisAndBack(t *testing.T) {
	t.Parallel()
	own := testenv.OwnRedis(t)
	b := newBundle(t, testenv.RedisClient(t, own.URL()), "dq")
	ctx := ctxT(t)
	b.start(t, relay.Config{RepairRate: -1})

	past := time.Now().Add(-time.Hour)
	var tasks []outbox.Task
	for i := range 30 {
		tk := task("q", fmt.Sprintf("t%02d", i))
		tk.RunAt = past.Add(time.Duration(i) * time.Second)
		tk.Priority = i % 3 * 4 // 0, 4, 8
		tasks = append(tasks, tk)
	}
	b.enqueue(t, tasks...)
	one := task("q", "single")
	one.Priority, one.RunAt = 9, past.Add(time.Minute)
	if _, err := b.ob.Enqueue(ctx, b.pool, one); err != nil {
		t.Fatal(err)
	}
	later := task("q", "later")
	later.Priority, later.RunAt = 6, time.Now().Add(time.Hour)
	dead := task("q", "dead")
	dead.Priority = 5
	b.enqueue(t, later, dead)
	if _, err := b.pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'dead', done_at = now() WHERE task_id = 'dead'`); err != nil {
		t.Fatal(err)
	}
	if err := reconcile.RetryDead(ctx, b.pool, reconcile.Options{}, "q", "dead"); err != nil {
		t.Fatal(err)
	}
	if err := b.ob.Reschedule(ctx, b.pool, "q", "later", past.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	b.waitStates(t, 20*time.Second, map[string]int{"queued": 33})

	// Highest first; within one priority, by due time.
	var want []string
	for _, p := range []int{9, 8, 6, 5, 4, 0} {
		for _, tk := range append(append(slices.Clone(tasks), one, later), dead) {
			if tk.Priority == p {
				want = append(want, tk.ID)
			}
		}
	}
	// "dead" was due at its enqueue, "later" rescheduled to 2 minutes after
	// "past": both are alone at their priority, so the order above holds.
	check := func(when string) {
		t.Helper()
		for _, tk := range append(append(slices.Clone(tasks), one, later), dead) {
			if ti := b.info(t, "q", tk.ID); ti.Priority != tk.Priority || ti.State != dispatch.StateReady {
				t.Fatalf("%s: %s in Redis: %+v, want ready with priority %d", when, tk.ID, ti, tk.Priority)
			}
		}
	}
	check("relayed")
	if err := b.rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	rep, err := reconcile.Reconcile(ctx, b.pool, b.dq, reconcile.Options{})
	if err != nil || rep.Kinds[reconcile.MissingInRedis].Repaired != 33 {
		t.Fatalf("reconcile: %+v %v", rep, err)
	}
	check("restored")
	var got []string
	for len(got) < len(want) {
		cl, err := b.dq.Claim(ctx, "q", 4, time.Minute)
		if err != nil || len(cl.Tasks) == 0 {
			t.Fatalf("claim after %v: %+v %v", got, cl, err)
		}
		for _, c := range cl.Tasks {
			got = append(got, c.ID)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("claimed %v\nwant    %v", got, want)
	}
}
