package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/delayq/delayq/delayq"
)

// Group commit (QueueConfig.GroupCommit): the runs of a queue go to a channel that
// a few group loops serve, each on a connection of its own. A loop begins a
// transaction with the first run it takes and gives every run a savepoint of its
// own, opened together with the run's completion guard in one round trip:
//
//	BEGIN (the first run only); SAVEPOINT; guard
//	the handler's statements
//	ROLLBACK TO SAVEPOINT, when the handler failed
//	... the next runs, until MaxTasks, MaxWait, or no run can join ...
//	COMMIT
//
// The guard comes first: a task someone else finished is not run at all, and a
// handler's writes are never left without their completion. A failed run rolls
// back to its savepoint and is retried as any failed run, after the commit; when
// the commit fails, or its outcome is unknown, every run the group would have
// committed is recorded as failed, a record the outbox refuses for a task whose
// completion did commit (the guard's version check), which then settles as a
// duplicate. Redis hears of the group's successes in one CompleteMany call.

// groupSavepoint is the savepoint of the run in progress. pgx's own savepoints
// (a handler's tx.Begin) are named sp_<n>, the handler's transaction's own
// delayq_handler (handlerTx.pgxTx).
const groupSavepoint = "delayq_group"

// errGroupEnded is why a group's runs fail when a handler ended the group's
// transaction itself (a COMMIT or ROLLBACK sent as SQL through tx.Conn()).
var errGroupEnded = errors.New("worker: a handler ended the group's transaction")

// errHandlerAborted fails a run whose handler returned nil although one of its
// statements failed and aborted the transaction.
var errHandlerAborted = errors.New("worker: a statement of the handler failed (the transaction is aborted) but the handler returned nil")

// groups runs the transactional runs of one queue with group commit.
type groups struct {
	w    *Worker
	q    *queue
	hard context.Context // cancelled after the shutdown timeout
	in   chan *run       // buffered to Concurrency: the claim loop never waits
	held atomic.Int64    // runs added and not yet finished
	wg   sync.WaitGroup
}

func newGroups(w *Worker, q *queue, hard context.Context) *groups {
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
	skipped bool  // not run: its context ended first (lease lost, shutdown)
	refused bool  // its guard matched no row: settled by the row's state
	err     error // its handler failed; rolled back to its savepoint
}

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
	var (
		broken error // the transaction's outcome is lost or unknown
		begun  bool  // BEGIN was sent
	)
	for r := first; ; {
		var m member
		m, broken = g.step(conn.Conn(), r, begun)
		begun = begun || !m.skipped
		ms = append(ms, m)
		if broken != nil || len(ms) == gc.MaxTasks {
			break
		}
		var ok bool
		if r, ok = g.next(deadline, timer); !ok {
			break
		}
	}
	if begun && broken == nil {
		broken = g.commit(conn.Conn())
	}
	conn.Release() // the pool closes a connection left in a transaction
	g.settle(ms, broken)
	return ms
}

// step runs r in the group's transaction: its savepoint and guard, then its
// handler. begun says an earlier run began the transaction (and opened a
// savepoint). broken is not nil when the transaction can no longer commit.
func (g *groups) step(c *pgx.Conn, r *run, begun bool) (m member, broken error) {
	w, q, t := g.w, g.q, r.t
	m.r = r
	if r.ctx.Err() != nil {
		m.skipped = true
		return m, nil
	}
	r.start = time.Now()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), w.cfg.OpTimeout)
	defer cancel()

	// The savepoints nest (each run's inside the one before), which saves a
	// RELEASE a run: ROLLBACK TO rolls back to the innermost, this run's, and the
	// COMMIT commits them all.
	b := &pgx.Batch{}
	if !begun {
		b.Queue("BEGIN")
	}
	var saved, applied bool
	b.Queue("SAVEPOINT " + groupSavepoint).Exec(func(pgconn.CommandTag) error {
		saved = true
		return nil
	})
	b.Queue(w.store.SQL.Guard, t.Queue, t.ID, t.Version, q.cfg.ClearPayload).Exec(func(tag pgconn.CommandTag) error {
		applied = tag.RowsAffected() == 1
		return nil
	})
	if err := c.SendBatch(ctx, b).Close(); err != nil {
		m.err = fmt.Errorf("record completion: %w", err)
		if !saved {
			// Rolling back to the savepoint would roll back the runs before.
			return m, m.err
		}
		return m, g.rollback(ctx, c, err)
	}
	if !applied {
		m.refused = true
		return m, nil
	}

	tx := &handlerTx{ctx: r.ctx, conn: c}
	err := r.call(r.ctx, func(ctx context.Context) error { return q.tx(ctx, tx, t) })
	err = cmp.Or(tx.err, err)
	switch status := c.PgConn().TxStatus(); {
	case c.IsClosed():
		m.err = cmp.Or(err, errors.New("worker: the connection closed"))
		return m, m.err
	case status == 'I':
		m.err = errGroupEnded
		return m, errGroupEnded
	case err == nil && status == 'E':
		err = errHandlerAborted
	}
	if err != nil {
		m.err = err
		return m, g.rollback(ctx, c, err)
	}
	return m, nil
}

// rollback rolls the transaction back to the savepoint of the run in progress,
// after cause; the error is not nil when the transaction can no longer commit.
func (g *groups) rollback(ctx context.Context, c *pgx.Conn, cause error) error {
	if c.IsClosed() || c.PgConn().TxStatus() == 'I' {
		return cause
	}
	if _, err := c.Exec(ctx, "ROLLBACK TO SAVEPOINT "+groupSavepoint); err != nil {
		return fmt.Errorf("roll back to the run's savepoint: %w (after %w)", err, cause)
	}
	return nil
}

// commit commits the group; nil means it committed.
func (g *groups) commit(c *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(g.hard), g.w.cfg.OpTimeout)
	defer cancel()
	if st := c.PgConn().TxStatus(); st != 'T' {
		return fmt.Errorf("commit: transaction status %q", st)
	}
	tag, err := c.Exec(ctx, "COMMIT")
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if tag.String() != "COMMIT" { // Postgres answers ROLLBACK to a COMMIT it refused
		return fmt.Errorf("commit: Postgres answered %s", tag)
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
	leases := make([]delayq.Lease, 0, len(idx))
	runs := make([]*run, 0, len(idx))
	for _, i := range idx {
		r := ms[i].r
		r.hbOff()
		if f := w.hooks.beforeAck; f != nil {
			if err := f(r.t); err != nil {
				continue
			}
		}
		leases = append(leases, delayq.Lease{ID: r.t.ID, Token: r.ct.Token})
		runs = append(runs, r)
	}
	if len(leases) == 0 {
		return
	}
	done, err := w.dq.CompleteMany(ctx, g.q.name, leases)
	if err != nil {
		// Done in Postgres: redeliveries after the leases are suppressed by the guard.
		w.log.Warn("worker: ack failed after commit; the tasks will be suppressed when redelivered",
			"queue", g.q.name, "tasks", len(leases), "err", err)
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
