package delayq

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/transition"
	"github.com/delayq/delayq/internal/validate"
)

// run is one run of one claimed task.
type run struct {
	// slot frees the run's concurrency slot (idempotent): a plain run frees it
	// when its handler returns, before the bookkeeping, so a slow commit does not
	// keep the next due task from starting.
	slot func()
	w    *worker
	q    *queue
	ct   dispatch.ClaimedTask
	t    *Task
	lost atomic.Bool // the lease is known to be lost
	// failure is the error fail recorded (nil when the run did not fail).
	failure error
	beating atomic.Bool // the worker's heartbeats renew the lease (heartbeat.go)
	// out is how the run ended (set by finish); ended, when not nil, is closed
	// then (run waits on it).
	out   outcome
	ended chan struct{}
	// ctx is the handler's, cancelled (stop) with ErrLeaseLost when the lease
	// is lost and with ErrShutdown after the shutdown timeout; octx is the
	// observer's, which ctx derives from.
	ctx, octx context.Context
	stop      context.CancelCauseFunc
	start     time.Time // the handler's start, for the run's duration
}

// run executes a claimed task, does its bookkeeping and waits until the run has
// ended. hard is cancelled when the shutdown timeout has passed. It returns the
// task, how the run ended, and its failure (nil unless it failed).
func (w *worker) run(hard context.Context, q *queue, ct dispatch.ClaimedTask, claimedAt time.Time, slot func()) (*Task, outcome, error) {
	r := w.startRun(hard, q, ct, claimedAt, slot)
	r.ended = make(chan struct{})
	r.runOn()
	<-r.ended
	return r.t, r.out, r.failure
}

// start executes a claimed task and does its bookkeeping, or hands the run to the
// completion stages (completer.go), which end it.
func (w *worker) start(hard context.Context, q *queue, ct dispatch.ClaimedTask, claimedAt time.Time, slot func()) {
	w.startRun(hard, q, ct, claimedAt, slot).runOn()
}

// runOn runs the handler and settles the run, or hands it off.
func (r *run) runOn() {
	var o outcome
	if r.ct.Missed {
		bctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), r.w.cfg.OpTimeout)
		o = r.missDeadline(bctx)
		cancel()
	} else {
		o = r.execute(r.ctx)
	}
	if o != outPending {
		r.finish(o)
	}
}

// startRun counts a claimed task as in flight and starts its heartbeats; finish
// ends it.
func (w *worker) startRun(hard context.Context, q *queue, ct dispatch.ClaimedTask, claimedAt time.Time, slot func()) *run {
	maxAttempts := ct.MaxAttempts
	if q.cfg.MaxAttempts > 0 && q.cfg.MaxAttempts < maxAttempts {
		maxAttempts = q.cfg.MaxAttempts
	}
	r := &run{slot: slot, w: w, q: q, ct: ct, t: &Task{
		Queue: ct.Queue, ID: ct.ID, Payload: ct.Payload, Attempt: ct.Attempt,
		MaxAttempts: maxAttempts, Version: ct.Version, Due: ct.Due, ClaimedAt: claimedAt, Resumed: ct.Resumed,
		TraceContext: ct.TraceContext, StartBy: ct.StartBy,
	}}
	w.stats.claimed.Add(1)
	w.stats.inFlight.Add(1)
	r.octx = w.obs.RunStart(hard, r.t)
	r.ctx, r.stop = context.WithCancelCause(r.octx)
	r.start = time.Now()
	w.beats.on(r, r.start)
	return r
}

// finish ends a run with its outcome and frees its slot.
func (r *run) finish(o outcome) {
	w := r.w
	w.obs.RunEnd(context.WithoutCancel(r.octx), r.t, RunEndEvent{
		Outcome: Outcome(o), Err: r.failure, LeaseLost: r.lost.Load(), Duration: time.Since(r.start),
	})
	if f := w.hooks.finished; f != nil {
		f(r.t, o)
	}
	r.hbOff()
	r.stop(nil)
	w.stats.inFlight.Add(-1)
	r.slot()
	r.out = o
	if r.ended != nil {
		close(r.ended)
	}
}

// execute runs the handler and settles the task; it returns the outcome.
func (r *run) execute(ctx context.Context) outcome {
	w, q, t := r.w, r.q, r.t
	var (
		conn  *pgxpool.Conn
		tx    *handlerTx
		sqlTx *sql.Tx
		err   error
	)
	switch {
	case q.sql != nil:
		sqlTx, err = r.runSQL(ctx)
	case q.tx != nil:
		if conn, err = w.pool.Acquire(ctx); err != nil {
			err = fmt.Errorf("acquire a connection: %w", err)
		} else {
			tx = &handlerTx{ctx: ctx, conn: conn.Conn()}
			err = r.call(ctx, func(ctx context.Context) error { return q.tx(ctx, tx, t) })
			err = cmp.Or(tx.err, err)
		}
	default:
		err = r.call(ctx, func(ctx context.Context) error { return q.plain(ctx, t) })
		r.slot()
		if err == nil {
			return r.handOffPlain()
		}
	}

	// Bookkeeping outlives the handler's context: a finished handler's work is
	// recorded even during a shutdown, and a lost lease is handled by the guard.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.OpTimeout)
	defer cancel()
	if err == nil {
		var o outcome
		switch {
		case q.sql != nil:
			o, err = r.completeSQL(bctx, sqlTx)
		default:
			o, err = r.complete(bctx, conn, tx)
		}
		if err == nil {
			return o
		}
		// The completion did not commit (or we cannot tell): a failed run. If it
		// did commit after all, RecordFailure is refused and the guard settles it.
		return r.fail(bctx, err)
	}
	if tx != nil {
		tx.end(bctx)
		conn.Release()
	}
	if sqlTx != nil {
		_ = sqlTx.Rollback()
	}
	if errors.Is(err, transition.ErrCompletedByHandler) {
		return r.completedByHandler(bctx)
	}
	if ctx.Err() != nil { // we cancelled the handler
		switch cause := context.Cause(ctx); {
		case errors.Is(cause, ErrShutdown):
			return r.release(bctx)
		case errors.Is(cause, ErrLeaseLost):
			w.log.Warn("worker: handler interrupted, lease lost", "queue", t.Queue, "id", t.ID, "attempt", t.Attempt)
			r.noteLost(bctx, err)
			return outLeaseLost
		}
	}
	return r.fail(bctx, err)
}

// call runs the handler h through the queue's middleware, the worker's Recover
// outermost.
func (r *run) call(ctx context.Context, h Next) error {
	return chain(r.q.mws, r.t, h)(ctx)
}

// complete records a successful transactional run: the guard and the COMMIT go to
// Postgres in one round trip, so the handler's writes and the completion commit
// together or not at all, then Redis is acknowledged. (When the handler wrote
// nothing, the transaction never began: completeAlone.) It releases conn, and
// returns an error when nothing may have been committed.
// (Plain runs go through the batch recorder: handOffPlain.)
func (r *run) complete(ctx context.Context, conn *pgxpool.Conn, tx *handlerTx) (outcome, error) {
	if !tx.begun() {
		return r.completeAlone(ctx, conn)
	}
	d, open, err := r.w.ops.CommitDone(ctx, conn, r.lease(), r.q.cfg.ClearPayload)
	if open {
		tx.end(ctx)
	}
	// A COMMIT that failed ended the transaction too; the pool closes a
	// connection left in any other state.
	conn.Release()
	switch {
	case errors.Is(err, transition.ErrRefused):
		return r.refusedByState(ctx)
	case err != nil:
		return "", err
	}
	return r.handOff(d), nil
}

// completeAlone records a successful run whose handler wrote nothing: the guard
// commits on its own, as a plain UPDATE (nothing is queued behind it that its
// failure would have to abort). It releases conn.
func (r *run) completeAlone(ctx context.Context, conn *pgxpool.Conn) (outcome, error) {
	d, err := r.w.ops.MarkDone(ctx, conn, r.lease(), r.q.cfg.ClearPayload)
	conn.Release()
	if err != nil {
		return "", fmt.Errorf("record completion: %w", err)
	}
	if !d.OK() {
		return r.refusedByState(ctx)
	}
	return r.handOff(d), nil
}

// completedByHandler settles a run whose handler completed the task itself
// (transition.ErrCompletedByHandler): done at the run's version is this run's
// success, acknowledged; anything else is settled as a refused completion.
func (r *run) completedByHandler(ctx context.Context) outcome {
	st, err := r.w.store.Row(ctx, r.w.pool, r.t.Queue, r.t.ID)
	if err != nil {
		return r.fail(ctx, fmt.Errorf("read the completion the handler committed: %w", err))
	}
	if d, ok := transition.DoneByHandler(r.lease(), st); ok {
		return r.succeeded(ctx, d)
	}
	return r.refused(ctx, st)
}

// refusedByState settles a run whose guard matched no row, by the row's state now.
func (r *run) refusedByState(ctx context.Context) (outcome, error) {
	st, err := r.w.store.Row(ctx, r.w.pool, r.t.Queue, r.t.ID)
	if err != nil {
		return "", fmt.Errorf("record completion: %w", err)
	}
	return r.refused(ctx, st), nil
}

// succeeded counts a run whose completion committed and acks Redis, waiting for
// the ack (the hot paths hand the run off instead: handOff).
func (r *run) succeeded(ctx context.Context, d transition.Done) outcome {
	r.w.stats.succeeded.Add(1)
	r.ackFailed(r.ack(ctx, d))
	return outSucceeded
}

// ackFailed notes an ack of a committed run that failed: a lost lease, or an
// error logged (done in Postgres: a redelivery after the lease is suppressed by
// the guard).
func (r *run) ackFailed(err error) {
	if err = r.leaseErr(err); err != nil && !errors.Is(err, dispatch.ErrLeaseLost) {
		if r.w.rd.Report("ack", err) {
			return // Redis unreachable: logged once per outage
		}
		r.w.log.Warn("worker: ack failed after commit; the task will be suppressed when redelivered",
			"queue", r.t.Queue, "id", r.t.ID, "err", err)
	}
}

// ack tells Redis the task is done, through the acknowledger (which stops the
// heartbeats and runs the beforeAck hook first).
func (r *run) ack(ctx context.Context, d transition.Done) error {
	if ctx.Err() != nil {
		return fmt.Errorf("complete: %w", ctx.Err())
	}
	return r.acknowledge(d)
}

// leaseErr counts a lost lease (once per run) and passes err on.
func (r *run) leaseErr(err error) error {
	if errors.Is(err, dispatch.ErrLeaseLost) {
		r.markLost()
	}
	return err
}

func (r *run) markLost() {
	if r.lost.CompareAndSwap(false, true) {
		r.w.stats.leaseLost.Add(1)
	}
}

// refused settles a run whose completion or failure the outbox guard refused.
func (r *run) refused(ctx context.Context, st taskstate.RowState) outcome {
	w, t := r.w, r.t
	var reason string
	switch {
	case !st.Exists && r.q.plain != nil:
		// A task enqueued into Redis directly (delayq.Client.Enqueue), without
		// the outbox: a plain handler runs it, and Redis alone records that.
		d, _ := transition.DoneWithoutRow(r.lease(), st)
		return r.succeeded(ctx, d)
	case !st.Exists:
		// No outbox row: a transactional handler's guard has nothing to commit
		// with, so its effect is rolled back.
		reason = "no outbox row (a transactional handler needs the outbox)"
	case st.State.Finished():
		// A duplicate delivery (a lease that expired under a slow worker, an ack
		// lost after the commit, a relay that ran twice) or a cancelled task: the
		// effect was rolled back.
		reason = "task " + string(st.State)
	case st.Version != t.Version:
		// Rescheduled (or retried from dead): this run holds an older copy. The
		// relay puts the new version in Redis (at once, wherever its due time
		// lies), replacing whatever this ack leaves.
		reason = fmt.Sprintf("outbox holds version %d", st.Version)
	default:
		// Live at this version although the guard did not see it so: the row
		// changed between the guard and the read. Give it back for a later run.
		w.log.Warn("worker: outbox row changed under the completion; giving the task back",
			"queue", t.Queue, "id", t.ID, "version", t.Version, "state", st.State)
		r.hbOff()
		if err := w.ops.GiveBack(ctx, r.claim(), r.q.cfg.Backoff.delay(t.Attempt), "outbox row changed"); r.leaseErr(err) != nil &&
			!errors.Is(err, dispatch.ErrLeaseLost) {
			w.log.Warn("worker: giving back the task failed", "queue", t.Queue, "id", t.ID, "err", err)
		}
		return outStale
	}
	// Redis follows Postgres: this copy is acknowledged (dead if Postgres says so).
	w.stats.suppressed.Add(1)
	r.hbOff()
	if err := r.leaseErr(w.ops.Suppress(ctx, r.claim(), st)); err != nil && !errors.Is(err, dispatch.ErrLeaseLost) {
		w.log.Warn("worker: ack of a suppressed run failed", "queue", t.Queue, "id", t.ID, "err", err)
	}
	w.log.Info("worker: run suppressed, its effect rolled back", "queue", t.Queue, "id", t.ID,
		"version", t.Version, "attempt", t.Attempt, "reason", reason)
	return outSuppressed
}

// fail settles a run that returned an error: a snooze or a cancellation, or a
// failure: the attempt and error in Postgres, then a retry after the backoff in
// Redis, or, out of attempts or told not to retry, dead in Postgres first (with
// the queue's OnDead hook in the same transaction) and then in Redis.
func (r *run) fail(ctx context.Context, err error) outcome {
	w, t := r.w, r.t
	var snooze *snoozeError
	var cancel *cancelError
	steer := errors.As(err, &snooze) || errors.As(err, &cancel)
	if !steer {
		w.stats.failed.Add(1)
		r.failure = err
	}
	msg := validate.ErrorSummary(err.Error())
	if r.lost.Load() {
		// Another worker may hold the task now: its run decides.
		if !steer {
			r.reportError(ctx, Failure{Err: err, LeaseLost: true})
			r.noteLost(ctx, err)
		}
		w.log.Warn("worker: task failed after its lease was lost", "queue", t.Queue, "id", t.ID, "err", msg)
		r.hbOff()
		return outLeaseLost
	}
	switch {
	case snooze != nil:
		return r.snooze(ctx, snooze.Delay, "snoozed")
	case cancel != nil:
		return r.cancel(ctx, err)
	}
	dead, delay := r.decide(err)
	r.reportError(ctx, Failure{Err: err, Dead: dead, Delay: delay})
	w.log.Warn("worker: task failed", "queue", t.Queue, "id", t.ID, "attempt", t.Attempt,
		"max_attempts", t.MaxAttempts, "dead", dead, "err", msg)
	if dead && r.q.cfg.OnDead != nil {
		return r.dieWithHook(ctx, err)
	}

	if dead {
		res, err := w.ops.Kill(ctx, w.pool, r.claim(), r.failureOf(err))
		switch {
		case err != nil:
			// Dead goes to Postgres first: leave the lease to expire; the reaper
			// then declares the task dead and mirrors it into Postgres.
			w.log.Error("worker: recording a failure in the outbox failed", "queue", t.Queue, "id", t.ID, "err", err)
			r.hbOff()
			return outError
		case !res.Applied:
			return r.refusedNow(ctx) // finished elsewhere, or stale
		}
		return r.killed(res.RedisErr)
	}
	hook := r.q.cfg.OnDead != nil
	res, err := w.ops.Retry(ctx, w.pool, r.claim(), r.failureOf(err), delay, hook)
	if res.PostgresErr != nil {
		w.log.Error("worker: recording a failure in the outbox failed", "queue", t.Queue, "id", t.ID, "err", res.PostgresErr)
	}
	if !res.Applied {
		return r.refusedNow(ctx) // finished elsewhere, or stale
	}
	if err := r.leaseErr(err); err != nil {
		if !errors.Is(err, dispatch.ErrLeaseLost) {
			w.log.Error("worker: retry in Redis failed; the lease will expire", "queue", t.Queue, "id", t.ID, "err", err)
			return outError
		}
		return outLeaseLost
	}
	if res.Dead {
		// Redis counted the attempts out (the task's limit changed under us):
		// the death was mirrored into Postgres, marked for the sweep's hook.
		if res.DeadErr != nil {
			w.log.Error("worker: recording dead in the outbox failed", "queue", t.Queue, "id", t.ID, "err", res.DeadErr)
		} else if hook {
			w.wakeSweep()
		}
		w.stats.dead.Add(1)
		return outDead
	}
	w.stats.retried.Add(1)
	return outRetried
}

// noteLost keeps a run that failed after its lease was lost in the task's attempt
// history, which alone changes: whoever holds the task now decides its state.
// (Off the hot path: a lost lease is rare, and a run that succeeds writes no
// history.)
func (r *run) noteLost(ctx context.Context, err error) {
	if err := r.w.ops.NoteLost(ctx, r.w.pool, r.claim(), r.failureOf(err)); err != nil {
		r.w.log.Warn("worker: noting a lost run in the attempt history failed", "queue", r.t.Queue, "id", r.t.ID, "err", err)
	}
}

// failureOf is the failed run with err for the outbox: its whole message (cut
// there) and, for a panic, its stack (the attempt history keeps both).
func (r *run) failureOf(err error) transition.Failure {
	f := transition.Failure{Attempt: r.t.Attempt, Err: err.Error()}
	if p, ok := errors.AsType[*PanicError](err); ok {
		f.Stack = fromPanic(p.Stack)
	}
	return f
}

// fromPanic is a recovered panic's stack (debug.Stack's) from the panicking
// frame on: the goroutine's header line, then what follows the runtime's panic
// frame, so that the history's bound keeps the frames that tell where it
// happened rather than the recovery's own (debug.Stack, Recover, panic). A stack
// of another shape is kept whole.
func fromPanic(stack []byte) string {
	s := string(stack)
	header, rest, ok := strings.Cut(s, "\n")
	if !ok {
		return s
	}
	i := strings.Index("\n"+rest, "\npanic(")
	if i < 0 {
		return s
	}
	// Skip the panic frame: its function line and its file line.
	after := rest[i:]
	for range 2 {
		_, next, ok := strings.Cut(after, "\n")
		if !ok {
			return s
		}
		after = next
	}
	return header + "\n" + after
}

// release gives the lease of a run interrupted by shutdown back: the task is due
// again at once and the run is not counted as an attempt.
func (r *run) release(ctx context.Context) outcome {
	w, t := r.w, r.t
	r.hbOff()
	if err := r.leaseErr(w.ops.Release(ctx, r.claim())); err != nil {
		if !errors.Is(err, dispatch.ErrLeaseLost) {
			w.log.Warn("worker: release failed; the task runs after its lease", "queue", t.Queue, "id", t.ID, "err", err)
			return outError
		}
		return outLeaseLost
	}
	w.stats.released.Add(1)
	return outReleased
}

// claim is the run's claim, for the transitions: its heartbeats stop before
// the Redis write.
func (r *run) claim() transition.Claim {
	return transition.Claim{Key: r.key(), Token: r.ct.Token, BeforeRedis: r.hbOff}
}

// lease is the run's claim for a completion: the acknowledger stops the
// heartbeats itself, and the hot path makes no closure.
func (r *run) lease() transition.Claim {
	return transition.Claim{Key: r.key(), Token: r.ct.Token}
}

// hbOff stops the heartbeats of the run's lease (idempotent).
func (r *run) hbOff() { r.w.beats.off(r) }
