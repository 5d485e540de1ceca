package delayq

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

// BenchmarkClientFloor is the least client work a plain task needs in this design,
// without the worker around it: its share of a claim of 16 tasks (about the
// drain's tasks a claim) or 64, of one statement recording them done in Postgres,
// and of one call completing them in Redis, one after the other. It reports this
// process's CPU a task (getrusage: user + system), against drain-plain's Go CPU a
// task (BENCHMARKS.md, "The unmet targets again").
//
//	go test -run '^$' -bench BenchmarkClientFloor -benchtime 100000x ./delayq/worker
func BenchmarkClientFloor(b *testing.B) {
	for _, batch := range []int{16, 64} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) { clientFloor(b, batch) })
	}
}

func clientFloor(b *testing.B, floorBatch int) {
	ctx := context.Background()
	pool := testenv.Pool(b, testenv.PostgresURL(b))
	rdb, prefix := testenv.Redis(b)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		b.Fatal(err)
	}
	oc := ob.Config()
	store := taskstate.New(taskstate.Config{Schema: oc.Schema, NotifyChannel: oc.NotifyChannel, NotifyWithin: oc.NotifyWithin})
	if _, err := pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, queued_at)
SELECT 'q', 't-' || i, now(), '{}', 25, 'queued', now() FROM generate_series(0, $1::int - 1) AS i`, b.N); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE delayq_outbox`); err != nil {
		b.Fatal(err)
	}
	tasks := make([]dispatch.Task, b.N)
	for i := range tasks {
		tasks[i] = dispatch.Task{ID: fmt.Sprintf("t-%d", i), Payload: []byte("{}")}
	}
	if _, err := dq.Enqueue(ctx, "q", tasks...); err != nil {
		b.Fatal(err)
	}
	done := make([]taskstate.Completion, 0, floorBatch)
	leases := make([]dispatch.Lease, 0, floorBatch)
	before := cpuTime()
	b.ResetTimer()
	for n := 0; n < b.N; {
		cl, err := dq.Claim(ctx, "q", floorBatch, time.Minute)
		if err != nil || len(cl.Tasks) == 0 {
			b.Fatalf("claim after %d of %d: %d tasks, %v", n, b.N, len(cl.Tasks), err)
		}
		done, leases = done[:0], leases[:0]
		for _, t := range cl.Tasks {
			done = append(done, taskstate.Completion{Key: taskstate.Key{Queue: "q", ID: t.ID, Version: t.Version}})
			leases = append(leases, dispatch.Lease{ID: t.ID, Token: t.Token})
		}
		applied, err := store.MarkDoneMany(ctx, pool, done)
		if err != nil || len(applied) != len(done) || !applied[0] {
			b.Fatalf("mark done: %v, %v", applied, err)
		}
		if _, err := dq.CompleteMany(ctx, "q", leases); err != nil {
			b.Fatal(err)
		}
		n += len(cl.Tasks)
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(b.N), "cpu-µs/task")
}

// cpuTime is this process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
