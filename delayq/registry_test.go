package delayq

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/outbox"
)

// workers lists the registry of b's prefix.
func (b *bundle) workers(t *testing.T) []delayqtype.Worker {
	t.Helper()
	ws, err := b.dq.Workers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

// A running worker is listed with its host, pid, version, queues and their
// concurrency, and the task its handler is running; it is gone as soon as Run
// returns (the goodbye), not a lease later.
func TestWorkerRegistry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started, release := make(chan string, 1), make(chan struct{})
	h := b.start(t, WorkerConfig{Lease: 3 * time.Second}, func(w *worker) {
		_ = w.Handle("reg", func(ctx context.Context, tk *Task) error {
			started <- tk.ID
			<-release
			return nil
		}, QueueConfig{Concurrency: 3})
		_ = w.Handle("idle", func(context.Context, *Task) error { return nil }, QueueConfig{Concurrency: 7})
	})
	b.enqueue(t, task("reg", "r-1"))
	if id := <-started; id != "r-1" {
		t.Fatalf("started %s", id)
	}
	var got delayqtype.Worker
	waitFor(t, "the worker listed with r-1 running", func() bool {
		ws := b.workers(t)
		if len(ws) == 1 && len(ws[0].Running) == 1 {
			got = ws[0]
			return true
		}
		return false
	})
	host, _ := os.Hostname()
	if got.Host != host || got.PID != os.Getpid() || got.Version == "" || len(got.ID) != 16 || got.Lost {
		t.Errorf("worker %+v: want host %s, pid %d, a version, a 16-byte id, not lost", got, host, os.Getpid())
	}
	if len(got.Queues) != 2 || got.Queues["reg"] != 3 || got.Queues["idle"] != 7 {
		t.Errorf("queues %v, want reg 3 and idle 7", got.Queues)
	}
	r := got.Running[0]
	if got.InFlight != 1 || r.Queue != "reg" || r.ID != "r-1" || r.Attempt != 1 {
		t.Errorf("in flight %d, running %+v: want reg/r-1 attempt 1", got.InFlight, got.Running)
	}
	if r.ClaimedAt.Before(got.Started) || r.ClaimedAt.After(got.ReadAt) || got.LastBeat.After(got.ReadAt) {
		t.Errorf("started %v, claimed %v, last beat %v, read %v: out of order", got.Started, r.ClaimedAt, got.LastBeat, got.ReadAt)
	}
	if want := got.LastBeat.Add(3 * time.Second); !got.LostAt.Equal(want) {
		t.Errorf("lost at %v, want the last beat plus the lease, %v", got.LostAt, want)
	}

	close(release)
	h.expect(t, "r-1", outSucceeded)
	h.stop()
	if ws := b.workers(t); len(ws) != 0 {
		t.Errorf("after a graceful stop, still listed: %+v", ws)
	}
}

// A process that stops without its goodbye (killed) is listed as lost once its
// lease has passed since its last beat, then disappears when its entry expires.
func TestWorkerRegistryLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const lease, keep = 300 * time.Millisecond, time.Second
	h := b.start(t, WorkerConfig{Lease: lease}, func(w *worker) {
		w.hooks.noGoodbye, w.hooks.workerKeep = true, keep
		_ = w.Handle("gone", func(context.Context, *Task) error { return nil }, QueueConfig{})
	})
	waitFor(t, "the worker listed", func() bool { return len(b.workers(t)) == 1 })
	h.stop()
	stopped := time.Now()
	var lost delayqtype.Worker
	waitFor(t, "the worker listed as lost", func() bool {
		ws := b.workers(t)
		if len(ws) != 1 {
			t.Fatalf("listed %+v, want the lost worker", ws)
		}
		lost = ws[0]
		return lost.Lost
	})
	if lost.ReadAt.Before(lost.LostAt) || lost.LostAt.Sub(lost.LastBeat) != lease {
		t.Errorf("lost %+v: read before its lease ran out", lost)
	}
	waitFor(t, "the lost worker gone", func() bool { return len(b.workers(t)) == 0 })
	if d := time.Since(stopped); d < keep {
		t.Errorf("gone %v after the stop, before its keep of %v", d, keep)
	}
	// The index entry of the expired process goes with the next beat of another.
	h2 := b.start(t, WorkerConfig{Lease: lease}, func(w *worker) {
		_ = w.Handle("gone", func(context.Context, *Task) error { return nil }, QueueConfig{})
	})
	waitFor(t, "the second worker listed", func() bool { return len(b.workers(t)) == 1 })
	index, _ := dispatch.WorkerKeys(b.prefix)
	if ids := b.rdb.ZRange(context.Background(), index, 0, -1).Val(); len(ids) != 1 || ids[0] != b.workers(t)[0].ID {
		t.Errorf("index %v, want only the live worker", ids)
	}
	h2.stop()
}

// Many runs in flight: the record lists the 100 longest running, counts all.
func TestWorkerRegistryBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 300
	release := make(chan struct{})
	h := b.start(t, WorkerConfig{Lease: 3 * time.Second}, func(w *worker) {
		_ = w.Handle("many", func(ctx context.Context, tk *Task) error {
			<-release
			return nil
		}, QueueConfig{Concurrency: n})
	})
	var tasks []outbox.Task
	for _, id := range ids("m", n) {
		tasks = append(tasks, task("many", id))
	}
	b.enqueue(t, tasks...)
	var got delayqtype.Worker
	waitFor(t, fmt.Sprintf("%d runs in flight listed", n), func() bool {
		ws := b.workers(t)
		if len(ws) == 1 && ws[0].InFlight == n {
			got = ws[0]
			return true
		}
		return false
	})
	if len(got.Running) != maxRunningListed {
		t.Errorf("%d runs listed, want %d", len(got.Running), maxRunningListed)
	}
	for i := 1; i < len(got.Running); i++ {
		if got.Running[i].ClaimedAt.Before(got.Running[i-1].ClaimedAt) {
			t.Fatalf("running not the longest first: %+v", got.Running)
		}
	}
	_, procs := dispatch.WorkerKeys(b.prefix)
	size, err := b.rdb.MemoryUsage(context.Background(), procs+got.ID).Result()
	if err != nil {
		t.Fatal(err)
	}
	if size > 16<<10 {
		t.Errorf("the process hash takes %d bytes with %d runs in flight", size, n)
	}
	t.Logf("process hash: %d bytes with %d runs in flight, %d listed", size, n, len(got.Running))
	close(release)
	for range n {
		h.next(t)
	}
}

// BenchmarkRegistryInFlight is the registry's only touch of the runs' path: the
// copy of the heartbeats' map under its mutex, once a beat (every Lease/3),
// while runs start and end (heartbeats.on and off take the same mutex).
func BenchmarkRegistryInFlight(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("runs=%d", n), func(b *testing.B) {
			h := &heartbeats{runs: make(map[*run]*beat, n)}
			for i := range n {
				h.runs[&run{t: &Task{Queue: "q", ID: fmt.Sprint(i)}}] = &beat{}
			}
			b.ReportAllocs()
			for b.Loop() {
				if len(h.inFlight()) != n {
					b.Fatal("lost runs")
				}
			}
		})
	}
}
