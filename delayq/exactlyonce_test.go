package delayq

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

// 10,000 tasks, four workers (each with its own pool), a transactional handler:
// exactly one effect row per task.
func TestTenThousandTasksFourWorkersExactlyOnce(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("10,000 tasks")
	}
	b := setup(t)
	const n, workers = 10000, 4
	var finished atomic.Int64
	all := make(chan struct{})
	hs := make([]*harness, workers)
	started := time.Now()
	for i := range hs {
		pool := testenv.Pool(t, withParam(t, b.url, "pool_max_conns", "9"))
		name := fmt.Sprintf("w%d", i)
		hs[i] = b.startOn(t, pool, WorkerConfig{}, func(w *worker) {
			w.hooks.finished = func(*Task, outcome) {
				if finished.Add(1) == n {
					close(all)
				}
			}
			if err := w.HandleTx("bulk", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
				return insertEffect(ctx, tx, tk, name)
			}, QueueConfig{Concurrency: 8}); err != nil {
				t.Fatal(err)
			}
		})
	}
	tasks := make([]outbox.Task, n)
	for i, id := range ids("t", n) {
		tasks[i] = task("bulk", id)
	}
	b.enqueue(t, tasks...)
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		t.Fatalf("only %d of %d runs finished", finished.Load(), n)
	}
	elapsed := time.Since(started)
	var sum RunStats
	for i, h := range hs {
		h.stop()
		s := h.w.Stats()
		t.Logf("worker %d: %+v", i, s)
		sum.Succeeded += s.Succeeded
		sum.Suppressed += s.Suppressed
		sum.Failed += s.Failed
		if s.Succeeded == 0 {
			t.Errorf("worker %d ran nothing", i)
		}
	}
	t.Logf("%d tasks in %v (%.0f/s)", n, elapsed.Round(time.Millisecond), n/elapsed.Seconds())
	if sum.Succeeded != n || sum.Failed != 0 || sum.Suppressed != 0 {
		t.Errorf("succeeded %d, failed %d, suppressed %d; want %d, 0, 0", sum.Succeeded, sum.Failed, sum.Suppressed, n)
	}
	if got := b.count(t, `SELECT count(*) FROM effects`); got != n {
		t.Errorf("%d effect rows, want %d", got, n)
	}
	if got := b.count(t, `SELECT count(DISTINCT task_id) FROM effects`); got != n {
		t.Errorf("%d distinct tasks with effects, want %d", got, n)
	}
	if got := b.count(t, `SELECT count(*) FROM delayq_outbox WHERE state = 'done'`); got != n {
		t.Errorf("%d outbox rows done, want %d", got, n)
	}
	st, err := b.dq.Stats(context.Background(), "bulk")
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 0 || st.Active != 0 || st.Dead != 0 {
		t.Errorf("Redis still holds tasks: %+v", st)
	}
}

// A handler slower than its lease, heartbeats off: the reaper gives the task to a
// second worker; both handlers finish; one effect, one suppressed duplicate.
func TestSlowHandlerLosesLeaseSecondWorkerTakesOver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := WorkerConfig{Lease: 300 * time.Millisecond, HeartbeatInterval: -1}
	entered := make(chan struct{})
	bDone := make(chan struct{})
	var runs atomic.Int64
	a := b.start(t, cfg, func(w *worker) {
		_ = w.HandleTx("slow", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			runs.Add(1)
			if err := insertEffect(ctx, tx, tk, "a"); err != nil {
				return err
			}
			close(entered)
			<-bDone // slower than the lease: finish after the other worker did
			return nil
		}, QueueConfig{Concurrency: 1})
	})
	b.enqueue(t, task("slow", "x"))
	<-entered
	b.reaper(t, "slow")
	// The second worker heartbeats, so that its run keeps the task however slow
	// the machine is.
	second := b.start(t, WorkerConfig{Lease: cfg.Lease, HeartbeatInterval: 50 * time.Millisecond}, func(w *worker) {
		_ = w.HandleTx("slow", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			runs.Add(1)
			if tk.Attempt != 2 {
				t.Errorf("second run: attempt %d, want 2", tk.Attempt)
			}
			return insertEffect(ctx, tx, tk, "b")
		}, QueueConfig{Concurrency: 1})
	})
	second.expect(t, "x", outSucceeded)
	close(bDone)
	a.expect(t, "x", outSuppressed)

	if got := runs.Load(); got != 2 {
		t.Errorf("%d handler runs, want 2", got)
	}
	if got := b.count(t, `SELECT count(*) FROM effects`); got != 1 {
		t.Errorf("%d effect rows, want 1", got)
	}
	if got := b.count(t, `SELECT count(*) FROM effects WHERE worker = 'b'`); got != 1 {
		t.Errorf("the effect is not the second worker's")
	}
	sa, sb := a.w.Stats(), second.w.Stats()
	if sa.Suppressed+sb.Suppressed != 1 || sa.Suppressed != 1 {
		t.Errorf("suppressed: first worker %d, second %d; want 1, 0", sa.Suppressed, sb.Suppressed)
	}
	if sa.LeaseLost != 1 || sb.Succeeded != 1 || sa.Succeeded != 0 {
		t.Errorf("first worker %+v, second %+v", sa, sb)
	}
	if r := b.row(t, "slow", "x"); r.state != "done" {
		t.Errorf("outbox state %s", r.state)
	}
	if ti := b.info(t, "slow", "x"); ti.State != dispatch.StateMissing {
		t.Errorf("Redis state %s, want gone (acknowledged)", ti.State)
	}
}

// The commit succeeds and the Redis ack fails: after the lease the task is
// delivered again, the guard suppresses it, the effect stays single.
func TestAckFailsAfterCommitRedeliverySuppressed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.reaper(t, "ack")
	var runs, acks atomic.Int64
	// Heartbeats keep the second run's lease under load; the first run's ends
	// with its failed ack.
	h := b.start(t, WorkerConfig{Lease: time.Second, HeartbeatInterval: 50 * time.Millisecond}, func(w *worker) {
		w.hooks.beforeAck = func(*Task) error {
			if acks.Add(1) == 1 {
				return fmt.Errorf("injected: connection reset")
			}
			return nil
		}
		_ = w.HandleTx("ack", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			runs.Add(1)
			return insertEffect(ctx, tx, tk, "")
		}, QueueConfig{})
	})
	b.enqueue(t, task("ack", "x"))
	h.expect(t, "x", outSucceeded)
	if r := b.row(t, "ack", "x"); r.state != "done" {
		t.Fatalf("outbox state %s after the commit", r.state)
	}
	if ti := b.info(t, "ack", "x"); ti.State != dispatch.StateActive {
		t.Fatalf("Redis state %s, want still active (the ack failed)", ti.State)
	}
	f := h.expect(t, "x", outSuppressed)
	if f.task.Attempt != 2 {
		t.Errorf("redelivery attempt %d, want 2", f.task.Attempt)
	}
	if got := runs.Load(); got != 2 {
		t.Errorf("%d handler runs, want 2", got)
	}
	if got := b.count(t, `SELECT count(*) FROM effects`); got != 1 {
		t.Errorf("%d effect rows, want 1", got)
	}
	if ti := b.info(t, "ack", "x"); ti.State != dispatch.StateMissing {
		t.Errorf("Redis state %s, want gone (acknowledged)", ti.State)
	}
	if s := h.w.Stats(); s.Succeeded != 1 || s.Suppressed != 1 {
		t.Errorf("stats %+v", s)
	}
}

// A task claimed and completed while the relay transaction that moved it is still
// open; the relay rolls back. The guard matched 'pending': done once, never again.
func TestRelayRollsBackAfterWorkerClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	if _, err := b.ob.Enqueue(ctx, b.pool, task("rb", "x")); err != nil {
		t.Fatal(err)
	}
	// The relay: lock the pending row, put it into Redis, mark it queued... and
	// keep the transaction open.
	relay, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Rollback(ctx)
	var runAt time.Time
	if err := relay.QueryRow(ctx, `SELECT run_at FROM delayq_outbox WHERE state = 'pending'
		ORDER BY run_at LIMIT 10 FOR UPDATE SKIP LOCKED`).Scan(&runAt); err != nil {
		t.Fatal(err)
	}
	if _, err := b.dq.Enqueue(ctx, "rb", dispatch.Task{ID: "x", Payload: []byte("p"), RunAt: runAt, Version: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.Exec(ctx, `UPDATE delayq_outbox SET state = 'queued', queued_at = now() WHERE queue = 'rb' AND task_id = 'x'`); err != nil {
		t.Fatal(err)
	}

	var runs atomic.Int64
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.HandleTx("rb", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			runs.Add(1)
			return insertEffect(ctx, tx, tk, "")
		}, QueueConfig{})
	})
	// The worker's guard waits for the relay's row lock. There is no event to wait
	// for here but the lock wait itself, so look for it.
	tk := time.NewTicker(5 * time.Millisecond)
	defer tk.Stop()
	for b.count(t, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE NOT l.granted AND a.datname = current_database()`) == 0 {
		select {
		case f := <-h.done:
			t.Fatalf("run finished (%s) while the relay held the row lock", f.out)
		case <-tk.C:
		case <-ctx.Done():
			t.Fatal("the worker's completion never waited for the relay's lock")
		}
	}
	if err := relay.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	h.expect(t, "x", outSucceeded)

	if r := b.row(t, "rb", "x"); r.state != "done" {
		t.Errorf("outbox state %s, want done", r.state)
	}
	// The relay's next pass finds nothing to move. Even a repeated Redis enqueue,
	// which no relay sends for a finished row (Redis keeps no done record by
	// default), applies no second effect: the guard suppresses it.
	if n := b.count(t, `SELECT count(*) FROM delayq_outbox WHERE state = 'pending'`); n != 0 {
		t.Errorf("%d rows pending for the relay", n)
	}
	if _, err := b.dq.Enqueue(ctx, "rb", dispatch.Task{ID: "x", Payload: []byte("p"), Version: 1}); err != nil {
		t.Fatal(err)
	}
	h.expect(t, "x", outSuppressed)
	if runs.Load() != 2 || b.count(t, `SELECT count(*) FROM effects`) != 1 {
		t.Errorf("%d runs, %d effects; want 2 runs (the second suppressed), 1 effect", runs.Load(), b.count(t, `SELECT count(*) FROM effects`))
	}
}

// A cancelled task that is still in Redis runs, but its effect is rolled back.
func TestCancelledTaskSuppressed(t *testing.T) {
	t.Parallel()
	forWrites(t, func(t *testing.T, writes bool) {
		b := setup(t)
		b.enqueue(t, task("c", "x"))
		if err := b.ob.Cancel(context.Background(), b.pool, "c", "x"); err != nil {
			t.Fatal(err)
		}
		h := b.start(t, WorkerConfig{}, func(w *worker) {
			_ = w.HandleTx("c", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
				return maybeInsertEffect(ctx, tx, tk, "", writes)
			}, QueueConfig{})
		})
		h.expect(t, "x", outSuppressed)
		if n := b.count(t, `SELECT count(*) FROM effects`); n != 0 {
			t.Errorf("%d effects of a cancelled task", n)
		}
		if r := b.row(t, "c", "x"); r.state != "cancelled" {
			t.Errorf("outbox state %s", r.state)
		}
		if ti := b.info(t, "c", "x"); ti.State != dispatch.StateMissing {
			t.Errorf("Redis state %s, want gone (acknowledged)", ti.State)
		}
	})
}

// forWrites runs f as two parallel subtests: a transactional handler that writes
// (its guard goes with the COMMIT) and one that writes nothing (its guard commits
// alone).
func forWrites(t *testing.T, f func(t *testing.T, writes bool)) {
	for _, writes := range []bool{true, false} {
		t.Run(map[bool]string{true: "writes", false: "writes nothing"}[writes], func(t *testing.T) {
			t.Parallel()
			f(t, writes)
		})
	}
}

// maybeInsertEffect inserts the effect row when writes is set.
func maybeInsertEffect(ctx context.Context, tx pgx.Tx, tk *Task, worker string, writes bool) error {
	if !writes {
		return nil
	}
	return insertEffect(ctx, tx, tk, worker)
}

// A task rescheduled while a worker runs the old version: the old run cannot
// complete it, the old copy is acknowledged, not retried (it must not run again),
// and the relay's new version replaces it and runs.
func TestRescheduledWhileRunningStaleCopyAcknowledged(t *testing.T) {
	t.Parallel()
	forWrites(t, func(t *testing.T, writes bool) {
		b := setup(t)
		ctx := ctxT(t, time.Minute)
		b.enqueue(t, task("rs", "x"))
		entered, proceed := make(chan struct{}), make(chan struct{})
		h := b.start(t, WorkerConfig{}, func(w *worker) {
			_ = w.HandleTx("rs", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
				if tk.Version == 1 {
					close(entered)
					<-proceed
				}
				return maybeInsertEffect(ctx, tx, tk, fmt.Sprint(tk.Version), writes)
			}, QueueConfig{Backoff: Backoff{Base: time.Hour}})
		})
		<-entered
		runAt := time.Now().Add(-time.Second)
		if err := b.ob.Reschedule(ctx, b.pool, "rs", "x", runAt); err != nil {
			t.Fatal(err)
		}
		close(proceed)
		h.expect(t, "x", outSuppressed)
		if ti := b.info(t, "rs", "x"); ti.State != dispatch.StateMissing {
			t.Fatalf("stale copy: %+v, want gone (acknowledged, not given back to run again)", ti)
		}
		if r := b.row(t, "rs", "x"); r.state == "done" {
			t.Fatalf("the stale run completed the rescheduled row")
		}
		// The relay moves version 2 (the acknowledged copy left nothing behind).
		st, err := b.dq.Enqueue(ctx, "rs", dispatch.Task{ID: "x", Payload: []byte("p"), RunAt: runAt, Version: 2})
		if err != nil || st[0] != dispatch.Added {
			t.Fatalf("enqueue version 2: %v %v", st, err)
		}
		f := h.expect(t, "x", outSucceeded)
		if f.task.Version != 2 {
			t.Errorf("ran version %d", f.task.Version)
		}
		if r := b.row(t, "rs", "x"); r.state != "done" {
			t.Errorf("outbox state %s after version 2 ran, want done", r.state)
		}
		want := map[bool]int{true: 1, false: 0}[writes]
		if n := b.count(t, `SELECT count(*) FROM effects WHERE worker = '2'`); n != want || b.count(t, `SELECT count(*) FROM effects`) != want {
			t.Errorf("effects: want %d, of version 2", want)
		}
	})
}
