package delayq

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/delayq/delayq/internal/pglisten"
)

// ErrDeathWithoutHook is what a death recorded without its OnDead hook is:
// errors.Is(cause, ErrDeathWithoutHook) on the cause a DeadHook gets when the
// worker's sweep runs it later.
var ErrDeathWithoutHook = errors.New("death recorded without its hook")

// deferredDeathError is the cause an OnDead hook gets for a death recorded
// without it: the relay's reaper declared the task dead (its worker crashed or
// lost its lease on the last attempt), the relay refused the row as one Redis
// cannot hold, or a worker found that Redis had counted the attempts out. It is
// ErrDeathWithoutHook.
type deferredDeathError struct {
	// Reason is the death's recorded error (the row's last error).
	Reason string
	// DiedAt is when the death was recorded, by the database clock.
	DiedAt time.Time
}

func (e *deferredDeathError) Error() string { return e.Reason }

// Is makes errors.Is(e, ErrDeathWithoutHook) true.
func (e *deferredDeathError) Is(target error) bool { return target == ErrDeathWithoutHook }

// sweeper runs the OnDead hooks of the deaths recorded without them
// (transition dead-hook), for the queues this worker serves with a hook. A
// sweep runs at start, when such a death of one of those queues is notified at
// its commit (taskstate.Config.HookChannel), when a failed hook's retry falls
// due, and every Config.DeadHookSweep as a backstop.
type sweeper struct {
	w      *worker
	queues map[string]*queue
	names  []string
	wake   chan struct{} // a flag: several wake-ups make one sweep
	fails  int           // sweeps in a row that ended on an error
}

// newSweeper returns the sweeper of the queues with an OnDead hook, or nil when
// none has one.
func newSweeper(w *worker, queues []*queue) *sweeper {
	s := &sweeper{w: w, queues: map[string]*queue{}, wake: make(chan struct{}, 1)}
	for _, q := range queues {
		if q.cfg.OnDead != nil {
			s.queues[q.name] = q
			s.names = append(s.names, q.name)
		}
	}
	if len(s.names) == 0 {
		return nil
	}
	return s
}

// poke wakes the sweep loop.
func (s *sweeper) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// wakeSweep wakes the worker's sweep, if it has one: this worker recorded a
// death with the hook-pending mark.
func (w *worker) wakeSweep() {
	if s := w.sweep.Load(); s != nil {
		s.poke()
	}
}

// loop sweeps until ctx ends: at once, then on every wake-up, when the next mark
// falls due, or after the backstop interval.
func (s *sweeper) loop(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		wait := s.sweep(ctx)
		if b := s.w.cfg.DeadHookSweep; b > 0 && (wait <= 0 || wait > b) {
			wait = b
		}
		var timer <-chan time.Time
		if wait > 0 {
			t.Reset(wait)
			timer = t.C
		}
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-timer:
		}
		t.Stop()
	}
}

// sweep runs the hook of every due mark of the sweeper's queues, one transaction
// each, and returns how long to wait before the next sweep (0: until woken).
func (s *sweeper) sweep(ctx context.Context) time.Duration {
	w := s.w
	for ctx.Err() == nil {
		took, err := s.one(ctx)
		if err != nil {
			return s.failed(err)
		}
		if !took {
			break
		}
	}
	if ctx.Err() != nil {
		return 0
	}
	qctx, cancel := context.WithTimeout(ctx, w.cfg.OpTimeout)
	defer cancel()
	next, ok, err := w.store.NextDeadHook(qctx, w.pool, s.names)
	if err == nil {
		w.pg.OK()
	}
	switch {
	case err != nil:
		return s.failed(err)
	case !ok:
		s.fails = 0
		return 0
	case next == 0:
		// Due, but held by another worker's sweep (whose hook commits or marks
		// the row again for later): look again after a pause.
		return jitter(w.cfg.ErrorPause)
	}
	s.fails = 0
	return next
}

// failed logs a sweep that ended on an error and returns the pause before the
// next: ErrorPause, doubled with each failed sweep in a row up to a minute,
// jittered.
func (s *sweeper) failed(err error) time.Duration {
	if !s.w.pg.Report("sweep of dead hooks", err) {
		s.w.log.Warn("worker: sweep of dead hooks failed; trying again later", "err", err)
	}
	d := doubled(s.w.cfg.ErrorPause, s.fails)
	s.fails++
	return jitter(d)
}

// doubled is base doubled n times, up to a minute (or base, if longer).
func doubled(base time.Duration, n int) time.Duration {
	limit := max(time.Minute, base)
	d := base
	for range n {
		if d >= limit/2 {
			return limit
		}
		d *= 2
	}
	return d
}

// hookSavepoint is where a hook that failed is rolled back to, keeping the row
// lock, so that the mark is put back for later in the same transaction.
const hookSavepoint = "delayq_dead_hook"

// one takes the next due mark, runs its queue's OnDead hook and clears the mark
// in one transaction: the hook's writes and the clearing commit together, so
// the hook's effect commits exactly once. A hook that fails is rolled back to
// the savepoint and the mark put back, due after a backoff, in the same
// transaction. took is false when no mark was due; an error means nothing
// committed and the mark is as it was.
func (s *sweeper) one(ctx context.Context) (took bool, err error) {
	w := s.w
	// The transaction outlives ctx: a hook that began finishes (or fails) within
	// OpTimeout, as a run's bookkeeping does.
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.OpTimeout)
	defer cancel()
	tx, err := w.pool.Begin(octx)
	if err != nil {
		return false, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(octx)) }()
	row, ok, err := w.ops.TakeDeadHook(octx, tx, s.names)
	if err != nil || !ok {
		return false, err
	}
	q := s.queues[row.Queue]
	t := &Task{
		Queue: row.Queue, ID: row.ID, Payload: row.Payload, Attempt: row.Attempt,
		MaxAttempts: row.MaxAttempts, Version: row.Version, Due: row.RunAt,
		TraceContext: row.TraceContext, StartBy: row.StartBy,
	}
	if q.cfg.MaxAttempts > 0 && q.cfg.MaxAttempts < t.MaxAttempts {
		t.MaxAttempts = q.cfg.MaxAttempts
	}
	cause := &deferredDeathError{Reason: row.LastError, DiedAt: row.DiedAt}
	if _, err := tx.Exec(octx, "SAVEPOINT "+hookSavepoint); err != nil {
		return false, fmt.Errorf("savepoint: %w", err)
	}
	hookErr := Recover(w.log)(octx, t, func(ctx context.Context) error { return q.cfg.OnDead(ctx, tx, t, cause) })
	if hookErr != nil {
		w.stats.sweptHookFailed.Add(1)
		w.prom.deadHook(t.Queue, false)
		delay := hookRetry(q.cfg.Backoff, time.Since(row.DiedAt))
		w.log.Error("worker: the dead hook of a death recorded without it failed; it runs again later",
			"queue", t.Queue, "id", t.ID, "version", t.Version, "after", delay, "err", hookErr)
		if _, err := tx.Exec(octx, "ROLLBACK TO SAVEPOINT "+hookSavepoint); err != nil {
			return false, fmt.Errorf("roll back the dead hook of %s/%s: %w", t.Queue, t.ID, err)
		}
		if err := w.ops.DelayDeadHook(octx, tx, row.Key, delay); err != nil {
			return false, err
		}
		if err := tx.Commit(octx); err != nil {
			return false, fmt.Errorf("commit: %w", err)
		}
		return true, nil
	}
	if err := tx.Commit(octx); err != nil {
		return false, fmt.Errorf("commit the dead hook of %s/%s: %w", t.Queue, t.ID, err)
	}
	w.stats.sweptHooks.Add(1)
	w.prom.deadHook(t.Queue, true)
	w.log.Info("worker: dead hook ran for a death recorded without it", "queue", t.Queue, "id", t.ID,
		"version", t.Version, "reason", row.LastError)
	return true, nil
}

// hookRetry is how long a failed hook's mark waits: the time since the death,
// within the queue's backoff bounds, with equal jitter. Each failure so about
// doubles the wait, and the wait is the same whichever worker ran the hook.
func hookRetry(b Backoff, sinceDeath time.Duration) time.Duration {
	return jitter(min(max(sinceDeath, b.Base), b.Max))
}

// jitter returns a random duration in [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d - rand.N(d/2+1)
}

// listen holds a connection of its own (taken out of the pool) that LISTENs on
// the hook channel and wakes the sweep for the deaths of its queues, until ctx
// ends. After (re)connecting it wakes the sweep once, since notifications sent
// while it was away are lost.
func (s *sweeper) listen(ctx context.Context) {
	w := s.w
	fails := 0
	for ctx.Err() == nil {
		err := s.listenOnce(ctx, func() { fails = 0; s.poke() })
		if ctx.Err() != nil {
			return
		}
		if !w.pg.Report("listen for deaths recorded without their hook", err) {
			w.log.Warn("worker: listening for deaths recorded without their hook failed", "err", err)
		}
		t := time.NewTimer(jitter(doubled(w.cfg.ErrorPause, fails)))
		fails++
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (s *sweeper) listenOnce(ctx context.Context, up func()) error {
	return pglisten.Listen(ctx, s.w.pool, s.w.store.Config().HookChannel(), up, func(queue string) {
		if slices.Contains(s.names, queue) {
			s.poke()
		}
	})
}
