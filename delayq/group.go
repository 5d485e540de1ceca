package delayq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/transition"
)

// Group commit (QueueConfig.GroupCommit): the runs of a queue go to a channel that
// a few group loops serve, each on a connection of its own. A loop runs the runs
// it takes one after another in one transaction, and sends the guards of all of
// them in one statement with the COMMIT:
//
//	[BEGIN;] SAVEPOINT delayq_group_i; the handler's first statement
//	                                             (only a run whose handler sends any)
//	the handler's other statements
//	ROLLBACK TO SAVEPOINT delayq_group_i, when the handler failed
//	... the next runs, until MaxTasks, MaxWait, or no run can join ...
//	GuardGroup (every run's guard); COMMIT       (one round trip)
//
// A run whose handler sends nothing costs no round trip: a group of such runs is
// one statement, the guards alone, committing on their own. The savepoints nest
// (none is released: a RELEASE would cost a round trip) and only a failed run,
// the innermost at that time, is rolled back to its own.
//
// The invariant is that a task's effect commits if and only if its completion
// does. The guards run after the handlers, so a run whose guard refuses (its task
// finished, cancelled or rescheduled meanwhile; a copy run elsewhere after a lost
// lease) may have written. GuardGroup divides by zero when the guard of a run that
// wrote refuses: the error aborts the transaction and Postgres skips the COMMIT
// queued behind it, so nothing of the group commits. The loop then rolls the group
// back, reads which runs were refused from their rows (a refusal is final: a row
// never comes back to a version it left, nor leaves a finished state at it), and
// runs the group again without them: the runs that wrote run their handlers
// again in a new transaction, and every guard is sent again with its COMMIT. Each
// pass drops at least one run, so a group ends. A refused run that wrote nothing
// has nothing to roll back: GuardGroup reports it and the others commit.
//
// A failed run is retried as any failed run, after the commit; when the commit
// fails, or its outcome is unknown, every run the group would have committed is
// recorded as failed, a record the outbox refuses for a task whose completion did
// commit (the version check), which then settles as a duplicate. Redis hears of
// the group's successes in one CompleteMany call.

// groupSavepoint is the savepoint of the group's i-th run. Each run's has a name
// of its own, so that rolling back to a savepoint that failed to open fails
// rather than rolling back an earlier run's. pgx's own savepoints (a handler's
// tx.Begin) are named sp_<n>, the handler's transaction's own delayq_handler
// (handlerTx.pgxTx).
func groupSavepoint(i int) string { return "delayq_group_" + strconv.Itoa(i) }

// errGroupEnded is why a run fails when its handler ended the group's transaction
// itself (a COMMIT or ROLLBACK sent as SQL through tx.Conn()).
var errGroupEnded = errors.New("worker: a handler ended the group's transaction")

// errHandlerAborted fails a run whose handler returned nil although one of its
// statements failed and aborted the transaction.
var errHandlerAborted = errors.New("worker: a statement of the handler failed (the transaction is aborted) but the handler returned nil")

// groups runs the transactional runs of one queue with group commit.
type groups struct {
	w    *worker
	q    *queue
	hard context.Context // cancelled after the shutdown timeout
	in   chan *run       // buffered to Concurrency: the claim loop never waits
	held atomic.Int64    // runs added and not yet finished
	wg   sync.WaitGroup
}

func newGroups(w *worker, q *queue, hard context.Context) *groups {
	g := &groups{w: w, q: q, hard: hard, in: make(chan *run, q.cfg.Concurrency)}
	gc := q.cfg.GroupCommit
	for range (q.cfg.Concurrency + gc.MaxTasks - 1) / gc.MaxTasks {
		g.wg.Go(g.loop)
	}
	return g
}

// add hands a claimed run to the group loops.
func (g *groups) add(r *run) {
	g.held.Add(1)
	g.in <- r
}

// close ends the loops once the runs added are done; call it after the last add.
func (g *groups) close() { close(g.in) }

// wait returns when the loops have ended.
func (g *groups) wait() { g.wg.Wait() }

func (g *groups) loop() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	ms := make([]member, 0, g.q.cfg.GroupCommit.MaxTasks)
	for r := range g.in {
		ms = g.run(r, timer, ms[:0])
	}
}

// member is one run of a group, and how its part in the transaction ended.
type member struct {
	r       *run
	skipped bool            // not run: its context ended first (lease lost, shutdown)
	wrote   bool            // its handler sent statements, in its savepoint
	refused bool            // its guard matched no row, or its task is in the group already: settled by the row's state
	err     error           // its handler failed; rolled back to its savepoint
	d       transition.Done // its completion, once committed
}

// pending tells whether the run's completion is still to commit.
func (m *member) pending() bool { return !m.skipped && !m.refused && m.err == nil }

// next returns the next run to join the group before deadline: one waiting, or
// one arriving, unless none can (every slot of the queue is held by a run in a
// group, so none can be claimed).
func (g *groups) next(deadline time.Time, timer *time.Timer) (*run, bool) {
	d := time.Until(deadline)
	if d <= 0 {
		return nil, false
	}
	select {
	case r, ok := <-g.in:
		return r, ok
	default:
	}
	if g.held.Load() >= int64(g.q.cfg.Concurrency) {
		return nil, false
	}
	timer.Reset(d)
	defer timer.Stop()
	select {
	case r, ok := <-g.in:
		return r, ok
	case <-timer.C:
		return nil, false
	}
}

// run runs one group, from first, and settles every run of it.
func (g *groups) run(first *run, timer *time.Timer, ms []member) []member {
	w, gc := g.w, g.q.cfg.GroupCommit
	deadline := time.Now().Add(gc.MaxWait)
	actx, cancel := context.WithTimeout(context.WithoutCancel(g.hard), w.cfg.OpTimeout)
	conn, err := w.pool.Acquire(actx)
	cancel()
	if err != nil {
		g.settle([]member{{r: first, err: fmt.Errorf("acquire a connection: %w", err)}}, nil)
		return ms
	}
	c := conn.Conn()
	var broken error // the transaction's outcome is lost or unknown
	for r := first; ; {
		r.start = time.Now() // the run's duration is its handler's and its wait for the commit
		ms = append(ms, member{r: r})
		broken = g.step(c, ms, len(ms)-1)
		if broken != nil || len(ms) == gc.MaxTasks {
			break
		}
		var ok bool
		if r, ok = g.next(deadline, timer); !ok {
			break
		}
	}
	if broken == nil {
		broken = g.end(c, ms)
	}
	conn.Release() // the pool closes a connection left in a transaction
	g.settle(ms, broken)
	return ms
}

// step runs ms[i] in the group's transaction: its handler, in its savepoint if
// it sends anything. broken is not nil when the transaction can no longer commit.
func (g *groups) step(c *pgx.Conn, ms []member, i int) (broken error) {
	w, q := g.w, g.q
	m := &ms[i]
	r, t := m.r, m.r.t
	*m = member{r: r} // a run again after a refusal starts afresh
	if r.ctx.Err() != nil {
		m.skipped = true
		return nil
	}
	for j := range ms[:i] {
		if ms[j].pending() && ms[j].r.t.ID == t.ID {
			// Claimed again (its first lease lost) while its first run waits for
			// the commit: one guard of a key is one completion.
			m.refused = true
			return nil
		}
	}
	began := c.PgConn().TxStatus() != 'I' // an earlier run wrote
	sp := groupSavepoint(i)
	tx := &handlerTx{ctx: r.ctx, conn: c, sp: sp}
	err := r.call(r.ctx, func(ctx context.Context) error { return q.tx(ctx, tx, t) })
	err = cmp.Or(tx.err, err)
	m.wrote = tx.spOpen
	switch status := c.PgConn().TxStatus(); {
	case c.IsClosed():
		m.err = cmp.Or(err, errors.New("worker: the connection closed"))
		return m.err
	case status == 'I' && (began || m.wrote):
		// The runs before it are recorded as failed. (If the handler sent COMMIT,
		// their writes committed ahead of their guards: handlerTx.Conn says not to.)
		m.err = errGroupEnded
		return errGroupEnded
	case status == 'E' && !m.wrote:
		// Aborted, and not in this run's savepoint (which did not open).
		m.err = cmp.Or(err, errHandlerAborted)
		return m.err
	case err == nil && status == 'E':
		err = errHandlerAborted
	}
	if err == nil {
		return nil
	}
	m.err = err
	if !m.wrote {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), w.cfg.OpTimeout)
	defer cancel()
	if _, rerr := c.Exec(ctx, "ROLLBACK TO SAVEPOINT "+sp); rerr != nil {
		return fmt.Errorf("roll back to the run's savepoint: %w (after %w)", rerr, err)
	}
	return nil
}

// end sends the guards of the runs still to commit and the COMMIT, in one round
// trip (the guards alone, committing on their own, when no run wrote). When the
// guard of a run that wrote refused, it rolls the group back, marks the runs
// whose rows refuse them, runs the others that wrote again, and ends again. nil
// means every run still pending committed its completion.
func (g *groups) end(c *pgx.Conn, ms []member) error {
	w := g.w
	ctx, cancel := context.WithTimeout(context.WithoutCancel(g.hard), w.cfg.OpTimeout)
	defer cancel()
	for {
		var (
			idx   []int
			cs    []transition.Completion
			wrote []bool
		)
		for i := range ms {
			if m := &ms[i]; m.pending() {
				idx = append(idx, i)
				cs = append(cs, transition.Completion{Claim: m.r.lease(), ClearPayload: g.q.cfg.ClearPayload})
				wrote = append(wrote, m.wrote)
			}
		}
		if len(idx) == 0 {
			if c.PgConn().TxStatus() != 'I' { // every run that wrote failed: nothing to commit
				if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
					return fmt.Errorf("roll back: %w", err)
				}
			}
			return nil
		}
		done, err := w.ops.CommitGroup(ctx, c, cs, wrote)
		switch {
		case errors.Is(err, transition.ErrRefused):
			// Nothing committed: the COMMIT was skipped.
			if err := g.dropRefused(ctx, c, ms, idx); err != nil {
				return err
			}
			continue
		case err != nil:
			return err
		}
		for k, i := range idx {
			ms[i].d = done[k]
			ms[i].refused = !done[k].OK()
		}
		return nil
	}
}

// dropRefused follows a group whose guards refused a run that wrote: it rolls the
// transaction back, marks the runs of idx that their rows refuse, and runs the
// others that wrote again (their writes were rolled back).
func (g *groups) dropRefused(ctx context.Context, c *pgx.Conn, ms []member, idx []int) error {
	w := g.w
	if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
		return fmt.Errorf("roll back a group whose guard refused a run: %w", err)
	}
	ids := make([]string, len(idx))
	for k, i := range idx {
		ids[k] = ms[i].r.t.ID
	}
	rows, err := w.store.Rows(ctx, c, g.q.name, ids)
	if err != nil {
		return fmt.Errorf("record completion: %w", err)
	}
	dropped := 0
	for _, i := range idx {
		t := ms[i].r.t
		if st, ok := rows[t.ID]; !ok || st.State.Finished() || st.Version != t.Version {
			ms[i].refused = true
			dropped++
		}
	}
	if dropped == 0 {
		// A refusal is final; this one is not seen in the rows.
		return errors.New("record completion: the guard refused a run whose row is live at its version")
	}
	for _, i := range idx {
		if m := &ms[i]; m.wrote && !m.refused {
			if err := g.step(c, ms, i); err != nil {
				return err
			}
		}
	}
	return nil
}

// settle does the bookkeeping of every run of a group after its transaction
// ended (committed when broken is nil), and ends them.
func (g *groups) settle(ms []member, broken error) {
	w := g.w
	ctx, cancel := context.WithTimeout(context.WithoutCancel(g.hard), w.cfg.OpTimeout)
	defer cancel()
	out := make([]outcome, len(ms))
	var acks []int
	for i, m := range ms {
		r := m.r
		switch {
		case m.skipped:
			out[i] = r.interrupted(ctx, r.ctx.Err())
		case m.refused:
			o, err := r.refusedByState(ctx)
			if err != nil {
				o = r.fail(ctx, err)
			}
			out[i] = o
		case m.err != nil:
			if r.ctx.Err() != nil {
				out[i] = r.interrupted(ctx, m.err)
			} else {
				out[i] = r.fail(ctx, m.err)
			}
		case broken != nil:
			// Maybe committed: the outbox refuses the failure of a task whose
			// completion committed, and the run is settled as a duplicate.
			out[i] = r.fail(ctx, broken)
		default:
			w.stats.succeeded.Add(1)
			out[i] = outSucceeded
			acks = append(acks, i)
		}
	}
	g.ack(ctx, ms, acks)
	for i, m := range ms {
		m.r.finish(out[i])
		g.held.Add(-1)
	}
}

// ack acknowledges the group's successful runs (ms[i] for i in idx) in Redis,
// with one call.
func (g *groups) ack(ctx context.Context, ms []member, idx []int) {
	w := g.w
	ds := make([]transition.Done, 0, len(idx))
	runs := make([]*run, 0, len(idx))
	for _, i := range idx {
		r := ms[i].r
		r.hbOff()
		if f := w.hooks.beforeAck; f != nil {
			if err := f(r.t); err != nil {
				continue
			}
		}
		ds = append(ds, ms[i].d)
		runs = append(runs, r)
	}
	if len(ds) == 0 {
		return
	}
	done, err := w.ops.AckDone(ctx, ds)
	if err != nil {
		// Done in Postgres: redeliveries after the leases are suppressed by the guard.
		w.log.Warn("worker: ack failed after commit; the tasks will be suppressed when redelivered",
			"queue", g.q.name, "tasks", len(ds), "err", err)
		return
	}
	for i, r := range runs {
		if !done[i] {
			r.markLost()
		}
	}
}

// interrupted settles a run whose context ended: given back at a shutdown, left
// to its new holder after a lost lease.
func (r *run) interrupted(ctx context.Context, err error) outcome {
	switch cause := context.Cause(r.ctx); {
	case errors.Is(cause, ErrShutdown):
		return r.release(ctx)
	case errors.Is(cause, ErrLeaseLost):
		r.w.log.Warn("worker: handler interrupted, lease lost", "queue", r.t.Queue, "id", r.t.ID, "attempt", r.t.Attempt)
		r.hbOff()
		return outLeaseLost
	}
	return r.fail(ctx, err)
}
