package dispatch

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
)

// EnqueuePipelined writes the tasks of several queues, larger than one script
// batch, in one round trip, with the statuses of each task; a repeat is all
// duplicates; a task set aside by ValidateTask fails the call before anything is
// written.
func TestEnqueuePipelined(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{EnqueueBatch: 3})
	ctx := ctxT(t)
	due := redisNow(t, b.rdb).Add(time.Hour)
	mk := func(n int, prefix string) []Task {
		var ts []Task
		for i := range n {
			ts = append(ts, Task{ID: fmt.Sprintf("%s%d", prefix, i), Payload: []byte("p"), RunAt: due, MaxAttempts: 2, Version: 1})
		}
		return ts
	}
	batches := []QueueTasks{{Queue: "a", Tasks: mk(7, "a")}, {Queue: "b", Tasks: mk(2, "b")}, {Queue: "empty"}}
	out, err := b.c.EnqueuePipelined(ctx, batches)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 3 || len(out[0]) != 7 || len(out[1]) != 2 || len(out[2]) != 0 {
		t.Fatalf("statuses shaped %v", out)
	}
	for i, st := range out {
		for j, s := range st {
			if s != Added {
				t.Errorf("batch %d task %d: %v, want added", i, j, s)
			}
		}
	}
	for _, q := range []struct {
		queue string
		n     int64
	}{{"a", 7}, {"b", 2}} {
		k, _ := b.c.Keys(q.queue)
		if n, err := b.rdb.ZCard(ctx, k.Ready).Result(); err != nil || n != q.n {
			t.Errorf("ZCARD %s = %d, %v; want %d", k.Ready, n, err, q.n)
		}
	}
	ti, err := b.c.Inspect(ctx, "a", "a6")
	if err != nil || ti[0].State != StateReady || !ti[0].Score.Equal(ceilMilli(due)) || ti[0].MaxAttempts != 2 {
		t.Errorf("a/a6: %+v, %v", ti, err)
	}

	// Repeated: every task is a duplicate; a higher version replaces.
	batches[1].Tasks[1].Version = 2
	out, err = b.c.EnqueuePipelined(ctx, batches)
	if err != nil {
		t.Fatal(err)
	}
	if out[0][0] != Duplicate || out[0][6] != Duplicate || out[1][0] != Duplicate || out[1][1] != Replaced {
		t.Errorf("repeat: %v", out)
	}

	// Invalid input: nothing written.
	before := b.snapshot(t)
	bad := []QueueTasks{{Queue: "c", Tasks: mk(2, "c")}, {Queue: "d", Tasks: []Task{{ID: "x", MaxAttempts: -1}}}}
	if err := b.c.ValidateTask(bad[1].Tasks[0]); !errors.Is(err, ErrInvalidTask) {
		t.Errorf("ValidateTask: %v, want ErrInvalidTask", err)
	}
	if _, err := b.c.EnqueuePipelined(ctx, bad); !errors.Is(err, ErrInvalidTask) {
		t.Errorf("invalid task: %v, want ErrInvalidTask", err)
	}
	if _, err := b.c.EnqueuePipelined(ctx, []QueueTasks{{Queue: "bad queue", Tasks: mk(1, "x")}}); !errors.Is(err, ErrInvalidQueue) {
		t.Errorf("invalid queue: %v, want ErrInvalidQueue", err)
	}
	sameSnapshot(t, "invalid input", before, b.snapshot(t))
}

// After SCRIPT FLUSH (or a restart) the script is loaded again and the pipeline
// resent. A server of its own: flushing the shared one would touch other tests.
func TestEnqueuePipelinedNoScript(t *testing.T) {
	t.Parallel()
	own := testenv.OwnRedis(t)
	rdb := testenv.RedisClient(t, own.URL())
	c, err := New(rdb, Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	if _, err := c.EnqueuePipelined(ctx, []QueueTasks{{Queue: "q", Tasks: []Task{{ID: "1"}}}}); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	out, err := c.EnqueuePipelined(ctx, []QueueTasks{{Queue: "q", Tasks: []Task{{ID: "1"}, {ID: "2"}}}})
	if err != nil {
		t.Fatalf("after SCRIPT FLUSH: %v", err)
	}
	if out[0][0] != Duplicate || out[0][1] != Added {
		t.Errorf("after SCRIPT FLUSH: %v", out)
	}
}
