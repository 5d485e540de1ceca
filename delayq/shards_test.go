package delayq

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/queuectl"
)

// A worker that holds a queue's shard count of 1 learns that the queue was split
// from its next claim (the claim script reports the count shard 0 holds), and runs
// the tasks due in the new shards at once: not after its Client's ShardRefresh,
// nor after MaxWait (issue 29, defect 2: each task ran 30 s after its commit).
func TestWorkerLearnsShardCountOnClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	const queue = "split"
	producer := b.dq
	// The worker's Client trusts the count it read for longer than the test and
	// sleeps MaxWait when nothing is due: only the claim can tell it.
	wdq, err := dispatch.New(b.rdb, dispatch.Config{Prefix: b.prefix, ShardRefresh: time.Hour, MaxWait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b.dq = wdq
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.Handle(queue, func(context.Context, *Task) error { return nil }, QueueConfig{})
	})

	// A first task makes the worker read the count (1: the queue is not
	// sharded) and drains the queue.
	if _, err := producer.Enqueue(ctx, queue, dispatch.Task{ID: "first"}); err != nil {
		t.Fatal(err)
	}
	h.expect(t, "first", outSucceeded)

	// The drained queue is split into 3 shards, and tasks due now go into
	// shards 1 and 2 only: the worker's claim of shard 0 alone finds nothing.
	ctl, err := queuectl.New(b.pool, producer, b.ob.Config().Schema)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.SetShards(ctx, queue, 3); err != nil {
		t.Fatal(err)
	}
	var tasks []dispatch.Task
	in := map[int]int{}
	for i := 0; len(tasks) < 4; i++ {
		id := fmt.Sprintf("t%d", i)
		if k := dispatch.ShardOf(id, 3); k > 0 && in[k] < 2 {
			in[k]++
			tasks = append(tasks, dispatch.Task{ID: id})
		}
	}
	enqueued := time.Now()
	if _, err := producer.Enqueue(ctx, queue, tasks...); err != nil {
		t.Fatal(err)
	}
	// A correctness bound far below MaxWait (30 s), not a benchmark.
	const bound = 3 * time.Second
	for range tasks {
		select {
		case f := <-h.done:
			if f.out != outSucceeded {
				t.Fatalf("run of %s ended %q", f.task.ID, f.out)
			}
			if took := time.Since(enqueued); took > bound {
				t.Fatalf("%s ran %v after its enqueue, want under %v", f.task.ID, took, bound)
			}
		case <-time.After(bound):
			t.Fatalf("tasks in shards 1 and 2 not run within %v of their enqueue; stats %+v", bound, h.w.Stats())
		}
	}
	if n, err := wdq.Shards(ctx, queue); err != nil || n != 3 {
		t.Errorf("the worker's Client holds %d shards (%v), want 3", n, err)
	}
}
