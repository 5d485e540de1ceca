package delayq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/transition"
	"github.com/delayq/delayq/internal/validate"
)

// snoozeError is returned by Snooze.
type snoozeError struct{ Delay time.Duration }

// Snooze returns an error that makes the worker run the task again after d (0:
// at once) without counting this run as an attempt: the handler is not ready to
// do the work yet (a resource it waits for, a rate limit). A transactional
// handler's writes are rolled back. A task that snoozes for ever never dies.
func Snooze(d time.Duration) error { return &snoozeError{Delay: max(d, 0)} }

func (e *snoozeError) Error() string { return fmt.Sprintf("snoozed for %v", e.Delay) }

// cancelError is returned by Cancel.
type cancelError struct{ Err error }

// Cancel returns an error that finishes the task without effect: it is recorded
// as cancelled in the outbox, err as its last error (may be nil), and never runs
// again. A transactional handler's writes are rolled back; a plain handler's
// effects outside Postgres are its own. Use it when the work has become
// pointless (the order was deleted, say); a failure that should wait for a
// person is NoRetry.
func Cancel(err error) error { return &cancelError{Err: err} }

func (e *cancelError) Error() string {
	if e.Err == nil {
		return "cancelled"
	}
	return e.Err.Error()
}

func (e *cancelError) Unwrap() error { return e.Err }

// Failure is what the worker does about a failed run, as WorkerConfig.OnError
// sees it.
type Failure struct {
	// Err is the run's error (a *PanicError for a panic).
	Err error
	// Dead: the task is about to be dead (unless its OnDead hook fails). Else it
	// runs again after Delay.
	Dead  bool
	Delay time.Duration
	// LeaseLost: the worker had lost the task's lease; another run decides what
	// happens to it, so Dead and Delay are zero.
	LeaseLost bool
}

// DeadHook runs in the Postgres transaction that records the task's death, with
// the error that killed it: its writes commit with the death, or neither does.
// Mark the order payment_failed there and it happens exactly once, with the death.
// When the hook returns an error or panics, nothing of the death commits: the
// task stays live, the run is not counted, and it runs again after the queue's
// backoff; it becomes dead only together with a hook that succeeded.
//
// Deaths the relay records (its reaper's, after a worker crashed or lost its
// lease on the task's last attempt; a row Redis refuses) cannot run application
// code: they are marked in Postgres, and a worker that serves the queue with an
// OnDead hook runs it later in a transaction of its own that also clears the
// mark, so its writes commit once too (Config.DeadHookSweep). Its cause is then
// a *DeferredDeathError, and the hook's task has no ClaimedAt. A hook that fails
// there leaves the mark for a later sweep, after a backoff. While no worker
// serves the queue with a hook the mark stays, and the task shows in the dead
// letters (delayq dead list) as any dead task; a retry from dead drops the mark
// with the death it was for.
type DeadHook func(ctx context.Context, tx pgx.Tx, t *Task, err error) error

// reportError calls the worker's OnError, if any.
func (r *run) reportError(ctx context.Context, f Failure) {
	h := r.w.cfg.OnError
	if h == nil {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			r.w.log.Error("worker: error handler panicked", "queue", r.t.Queue, "id", r.t.ID, "panic", fmt.Sprint(v))
		}
	}()
	h(ctx, r.t, f)
}

// decide returns whether a failed run makes the task dead, and else the delay
// before the next run.
func (r *run) decide(err error) (dead bool, delay time.Duration) {
	q, t := r.q, r.t
	var noRetry *noRetryError
	var after *retryAfterError
	switch {
	case errors.As(err, &noRetry) || t.Attempt >= t.MaxAttempts:
		return true, 0
	case errors.As(err, &after):
		return false, max(after.Delay, time.Millisecond)
	case q.cfg.Retry != nil:
		d, ok := q.cfg.Retry(t.Attempt, err)
		return !ok, max(d, time.Millisecond)
	}
	return false, q.cfg.Backoff.delay(t.Attempt)
}

func (r *run) key() taskstate.Key {
	return taskstate.Key{Queue: r.t.Queue, ID: r.t.ID, Version: r.t.Version}
}

// snooze gives the task back to run after d without counting the run: the next
// run time in Postgres first, then Redis.
func (r *run) snooze(ctx context.Context, d time.Duration, why string) outcome {
	w, t := r.w, r.t
	res, err := w.ops.Snooze(ctx, w.pool, r.claim(), d)
	if res.PostgresErr != nil {
		// Postgres keeps the older run time: only a Redis rebuilt from it would
		// run the task sooner.
		w.log.Warn("worker: recording a snooze in the outbox failed", "queue", t.Queue, "id", t.ID, "err", res.PostgresErr)
	}
	if !res.Applied {
		return r.refusedNow(ctx)
	}
	if err := r.leaseErr(err); err != nil {
		if !errors.Is(err, dispatch.ErrLeaseLost) {
			w.log.Warn("worker: giving the task back failed; it runs after its lease", "queue", t.Queue, "id", t.ID, "err", err)
			return outError
		}
		return outLeaseLost
	}
	w.log.Debug("worker: run given back", "queue", t.Queue, "id", t.ID, "after", d, "why", why)
	w.stats.snoozed.Add(1)
	return outSnoozed
}

// cancel records the task cancelled by its run, then completes it in Redis.
func (r *run) cancel(ctx context.Context, reason error) outcome {
	w, t := r.w, r.t
	msg := validate.ErrorSummary(reason.Error())
	res, err := w.ops.CancelRun(ctx, w.pool, r.claim(), t.Attempt, reason.Error())
	switch {
	case err != nil:
		w.log.Error("worker: recording a cancellation in the outbox failed; the task runs after its lease", "queue", t.Queue, "id", t.ID, "err", err)
		r.hbOff()
		return outError
	case !res.Applied:
		return r.refusedNow(ctx)
	}
	if err := r.leaseErr(res.RedisErr); err != nil && !errors.Is(err, dispatch.ErrLeaseLost) {
		// Cancelled in Postgres: a redelivery is suppressed by the guard.
		w.log.Warn("worker: ack of a cancelled run failed", "queue", t.Queue, "id", t.ID, "err", err)
	}
	w.log.Info("worker: task cancelled by its handler", "queue", t.Queue, "id", t.ID, "reason", msg)
	w.stats.cancelled.Add(1)
	return outCancelled
}

// refusedNow settles a run whose guarded update matched nothing, by the row now.
func (r *run) refusedNow(ctx context.Context) outcome {
	st, err := r.w.store.Row(ctx, r.w.pool, r.t.Queue, r.t.ID)
	if err != nil {
		r.w.log.Error("worker: reading the outbox row failed", "queue", r.t.Queue, "id", r.t.ID, "err", err)
		r.hbOff()
		return outError
	}
	return r.refused(ctx, st)
}

// dieWithHook records the task's death and runs the queue's OnDead hook in one
// transaction. When anything of it fails, the death is not recorded and the run
// is given back, uncounted, to fail again after the backoff.
func (r *run) dieWithHook(ctx context.Context, cause error) outcome {
	w, q, t := r.w, r.q, r.t
	res, err := w.ops.KillTx(ctx, w.pool, r.claim(), r.failureOf(cause), r.hook(q.cfg.OnDead, cause))
	switch {
	case err != nil:
		w.log.Error("worker: the dead hook failed; the death is rolled back and the task runs again",
			"queue", t.Queue, "id", t.ID, "attempt", t.Attempt, "err", err)
		w.stats.deadHookFailed.Add(1)
		return r.snooze(ctx, q.cfg.Backoff.delay(t.Attempt), "dead hook failed")
	case !res.Applied:
		return r.refusedNow(ctx)
	}
	return r.killed(res.RedisErr)
}

// hook is a death's hook for the transition: the queue's hook, through the
// worker's Recover.
func (r *run) hook(h DeadHook, cause error) transition.Hook {
	return func(ctx context.Context, tx pgx.Tx) error {
		call := func(ctx context.Context) error { return h(ctx, tx, r.t, cause) }
		return Recover(r.w.log)(ctx, r.t, call)
	}
}

// killed counts a death Postgres committed, whose Redis write ended with err.
func (r *run) killed(err error) outcome {
	w, t := r.w, r.t
	r.hbOff()
	if err := r.leaseErr(err); err != nil && !errors.Is(err, dispatch.ErrLeaseLost) {
		// Postgres says dead; reconcile makes Redis agree (Postgres wins).
		w.log.Error("worker: kill in Redis failed", "queue", t.Queue, "id", t.ID, "err", err)
	}
	w.stats.dead.Add(1)
	return outDead
}
