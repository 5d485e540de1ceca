package delayq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delayq/delayq/internal/transition"
	"github.com/delayq/delayq/internal/validate"
)

// ErrMissedDeadline is what a task claimed after its start deadline
// (outbox.Task.StartBy) fails with: errors.Is(err, ErrMissedDeadline) on the
// cause a DeadHook gets. Its handler never ran.
var ErrMissedDeadline = errors.New("missed its start deadline")

// MissedDeadlineError tells when a task had to start by and when it was claimed,
// both by the Redis clock. It is ErrMissedDeadline.
type MissedDeadlineError struct {
	StartBy, ClaimedAt time.Time
}

// Error says which deadline the claim missed, and by how much.
func (e *MissedDeadlineError) Error() string {
	return fmt.Sprintf("missed its start deadline %s: claimed %v later",
		e.StartBy.UTC().Format(time.RFC3339Nano), e.ClaimedAt.Sub(e.StartBy))
}

// Is makes errors.Is(e, ErrMissedDeadline) true.
func (e *MissedDeadlineError) Is(target error) bool { return target == ErrMissedDeadline }

// missDeadline settles a task the claim found past its start deadline, without
// running its handler: dead in Postgres with the reason (transition
// miss-deadline), with the queue's OnMissedDeadline hook (else its OnDead hook)
// in the same transaction, then dead in Redis. A hook that fails rolls the death
// back, and the task is settled again after the backoff, as a failed OnDead hook.
func (r *run) missDeadline(ctx context.Context) outcome {
	w, q, t := r.w, r.q, r.t
	r.slot() // no handler runs
	cause := &MissedDeadlineError{StartBy: r.ct.StartBy, ClaimedAt: t.ClaimedAt}
	r.failure = cause
	msg := validate.ErrorSummary(cause.Error())
	hook := q.cfg.OnMissedDeadline
	if hook == nil {
		hook = q.cfg.OnDead
	}
	var (
		res transition.Outcome
		err error
	)
	if hook == nil {
		res, err = w.ops.MissDeadline(ctx, w.pool, r.claim(), msg)
	} else {
		res, err = w.ops.MissDeadlineTx(ctx, w.pool, r.claim(), msg, r.hook(hook, cause))
	}
	switch {
	case err != nil && hook != nil:
		w.log.Error("worker: the missed-deadline hook failed; the death is rolled back and the task is settled again later",
			"queue", t.Queue, "id", t.ID, "err", err)
		w.stats.deadHookFailed.Add(1)
		return r.snooze(ctx, q.cfg.Backoff.delay(t.Attempt), "missed-deadline hook failed")
	case err != nil:
		// Nothing recorded: the lease expires and a later claim finds it late again.
		w.log.Error("worker: recording a missed deadline in the outbox failed", "queue", t.Queue, "id", t.ID, "err", err)
		r.hbOff()
		return outError
	case !res.Applied:
		return r.refusedNow(ctx)
	}
	w.log.Info("worker: task missed its start deadline; dead, not run", "queue", t.Queue, "id", t.ID,
		"start_by", r.ct.StartBy, "claimed_at", t.ClaimedAt)
	w.stats.missedDeadline.Add(1)
	r.killed(res.RedisErr)
	return outMissedDeadline
}
