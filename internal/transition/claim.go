package transition

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
)

// The claim outcomes (the worker's transitions): done, fail-retry, fail-dead,
// snooze, run-cancel, miss-deadline, stale, and the release of a run a shutdown
// interrupted.

// Done is a completion Postgres committed (or, for a task enqueued without the
// outbox, a row that is not there): the one thing AckDone takes, so Redis is
// acknowledged only after the commit. The zero Done is a completion refused.
type Done struct {
	queue, id, token string
	ok               bool
}

// OK reports whether the completion committed (false: the guard refused it).
func (d Done) OK() bool { return d.ok }

// Queue returns the queue of the completed task.
func (d Done) Queue() string { return d.queue }

func done(c Claim) Done { return Done{queue: c.Queue, id: c.ID, token: c.Token, ok: true} }

// Completion is one run's completion.
type Completion struct {
	Claim
	// ClearPayload empties the payload of the done row.
	ClearPayload bool
}

// MarkDone (complete) runs the completion guard on q as a statement of its own:
// Done is OK if the row was pending or queued at the claim's version, and is
// now done.
//
// The key is not validated: a task enqueued into Redis without the outbox may
// hold one no row can (version 0), and the guard's refusal settles it.
func (o *Ops) MarkDone(ctx context.Context, q taskstate.Querier, c Claim, clearPayload bool) (Done, error) {
	tag, err := q.Exec(ctx, o.store.SQL.Guard, c.Queue, c.ID, c.Version, clearPayload)
	if err != nil {
		return Done{}, fmt.Errorf("mark done %s/%s: %w", c.Queue, c.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return Done{}, nil
	}
	return done(c), nil
}

// BatchSender sends a batch on a connection: *pgx.Conn and *pgxpool.Conn.
type BatchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// CommitDone (complete) ends a handler's transaction open on conn: the guard and
// the COMMIT in one round trip, so the handler's writes and the completion
// commit together or not at all. ErrRefused: the guard refused, nothing
// committed. open reports a transaction still to roll back (the guard failed
// and aborted it); an error with open false is a COMMIT that failed, whose
// outcome the row tells.
func (o *Ops) CommitDone(ctx context.Context, conn BatchSender, c Claim, clearPayload bool) (d Done, open bool, err error) {
	b := &pgx.Batch{}
	b.Queue(o.store.SQL.GuardAbort, c.Queue, c.ID, c.Version, clearPayload)
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	_, guardErr := br.Exec()
	_, commitErr := br.Exec()
	closeErr := br.Close()
	switch {
	case guardErr != nil && taskstate.RefusedByGuard(guardErr):
		return Done{}, true, ErrRefused
	case guardErr != nil:
		return Done{}, true, fmt.Errorf("record completion: %w", guardErr)
	}
	if err := cmp.Or(commitErr, closeErr); err != nil {
		return Done{}, false, fmt.Errorf("commit: %w", err)
	}
	return done(c), false, nil
}

// ErrTxEnded reports a database/sql transaction the handler ended itself: its
// writes may have committed without the completion.
var ErrTxEnded = errors.New("the handler ended its transaction")

// CommitDoneSQL (complete) is CommitDone for a handler's database/sql
// transaction: the guard in tx, then its commit; a refusal rolls tx back
// (ErrRefused). ErrTxEnded: the handler had ended tx.
func (o *Ops) CommitDoneSQL(ctx context.Context, tx *sql.Tx, c Claim, clearPayload bool) (Done, error) {
	applied, err := o.store.MarkDoneSQL(ctx, tx, c.Key, clearPayload)
	switch {
	case errors.Is(err, sql.ErrTxDone):
		return Done{}, ErrTxEnded
	case err != nil:
		_ = tx.Rollback()
		return Done{}, fmt.Errorf("record completion: %w", err)
	case !applied:
		_ = tx.Rollback()
		return Done{}, ErrRefused
	}
	if err := tx.Commit(); err != nil {
		return Done{}, fmt.Errorf("commit: %w", err)
	}
	return done(c), nil
}

// MarkDoneMany (complete) is MarkDone for many runs in one statement (its own
// transaction): done[i] is cs[i]'s, OK when it committed.
func (o *Ops) MarkDoneMany(ctx context.Context, q taskstate.Querier, cs []Completion) ([]Done, error) {
	tc := make([]taskstate.Completion, len(cs))
	for i, c := range cs {
		tc[i] = taskstate.Completion{Key: c.Key, ClearPayload: c.ClearPayload}
	}
	applied, err := o.store.MarkDoneMany(ctx, q, tc)
	if err != nil {
		return nil, err
	}
	out := make([]Done, len(cs))
	for i, c := range cs {
		if applied[i] {
			out[i] = done(c.Claim)
		}
	}
	return out, nil
}

// CommitGroup (complete) ends a group commit on conn: the guards of its runs
// (GuardGroup; wrote[i] says run i's handler wrote in the transaction) and, when
// a transaction is open, its COMMIT, in one round trip. done[i] is cs[i]'s.
// ErrRefused: the guard of a run that wrote was refused, which aborted the
// transaction (nothing committed; roll it back).
func (o *Ops) CommitGroup(ctx context.Context, conn *pgx.Conn, cs []Completion, wrote []bool) ([]Done, error) {
	tc := make([]taskstate.Completion, len(cs))
	for i, c := range cs {
		tc[i] = taskstate.Completion{Key: c.Key, ClearPayload: c.ClearPayload}
	}
	inTx := conn.PgConn().TxStatus() != 'I'
	applied := make([]bool, len(cs))
	b := &pgx.Batch{}
	if err := o.store.QueueGuardGroup(b, tc, wrote, applied); err != nil {
		return nil, fmt.Errorf("record completion: %w", err)
	}
	var tag pgconn.CommandTag
	if inTx {
		b.Queue("COMMIT").Exec(func(t pgconn.CommandTag) error {
			tag = t
			return nil
		})
	}
	err := conn.SendBatch(ctx, b).Close()
	switch {
	case err != nil && taskstate.RefusedByGuard(err) && inTx && !conn.IsClosed():
		return nil, ErrRefused // the COMMIT was skipped
	case err != nil:
		return nil, fmt.Errorf("record completion: %w", err)
	case inTx && tag.String() != "COMMIT": // Postgres answers ROLLBACK to a COMMIT it refused
		return nil, fmt.Errorf("commit: Postgres answered %s", tag)
	}
	out := make([]Done, len(cs))
	for i, c := range cs {
		if applied[i] {
			out[i] = done(c.Claim)
		}
	}
	return out, nil
}

// DoneWithoutRow is the completion of a task enqueued into Redis directly,
// without the outbox (delayq.Client.Enqueue), that a plain handler ran: Redis
// alone records it. ok is false when row exists: its state decides.
func DoneWithoutRow(c Claim, row taskstate.RowState) (d Done, ok bool) {
	if row.Exists {
		return Done{}, false
	}
	return done(c), true
}

// ErrCompletedByHandler is what a handler returns when it completed its task
// itself, in a transaction of its own (`delayq worker --transactional`: the
// command calls delayq_complete): the worker then reads the row instead of
// running its guard (DoneByHandler).
var ErrCompletedByHandler = errors.New("transition: the handler completed its task itself")

// DoneByHandler is the completion a handler committed itself: ok when row is
// done at the claim's version, which only that run's completion can have written
// (the guard admits one completion per version). Otherwise the row's state
// decides, as for a refused completion.
func DoneByHandler(c Claim, row taskstate.RowState) (d Done, ok bool) {
	if !row.Exists || row.State != taskstate.Done || row.Version != c.Version {
		return Done{}, false
	}
	return done(c), true
}

// AckDone tells Redis of completions Postgres committed, with one complete call
// for them all (they must be of one queue): acked[i] false means ds[i]'s lease
// was lost (another holder has the task; the guard refuses its run). Refused
// completions are skipped (acked false).
func (o *Ops) AckDone(ctx context.Context, ds []Done) (acked []bool, err error) {
	if len(ds) == 0 {
		return nil, nil
	}
	queue := ds[0].queue
	leases := make([]dispatch.Lease, 0, len(ds))
	idx := make([]int, 0, len(ds))
	for i, d := range ds {
		if !d.ok {
			continue
		}
		if d.queue != queue {
			return nil, fmt.Errorf("transition: ack of %s and %s in one call", queue, d.queue)
		}
		leases = append(leases, dispatch.Lease{ID: d.id, Token: d.token})
		idx = append(idx, i)
	}
	acked = make([]bool, len(ds))
	if len(leases) == 0 {
		return acked, nil
	}
	got, err := o.dq.CompleteMany(ctx, queue, leases)
	if err != nil {
		return nil, err
	}
	for k, i := range idx {
		acked[i] = got[k]
	}
	return acked, nil
}

// Failure is a failed run, for Retry, Kill and KillTx.
type Failure struct {
	// Attempt is the run that failed (1 for the first).
	Attempt int
	// Err is its error, whole: a summary of it is kept as the task's last error
	// (Postgres and Redis), a longer cut in the attempt history.
	Err string
	// Stack is a panic's stack, for the attempt history ("" for none).
	Stack string
}

// RetryOutcome is what Retry did.
type RetryOutcome struct {
	Outcome
	// PostgresErr: recording the failure failed; Redis was given the retry all
	// the same, and Applied is true (Postgres keeps the older run time, which
	// only a Redis rebuilt from it would use).
	PostgresErr error
	// Dead: Redis counted the attempts out (the task's limit changed under the
	// run); the death was then recorded in Postgres, marked for the OnDead hook
	// when hookPending (DeadErr: that record failed).
	Dead    bool
	DeadErr error
}

// Retry (fail-retry) records a failed run and the time of its next run in
// Postgres, then gives the lease back in Redis to run after delay. The error is
// Redis's (nothing in Redis changed): errors.Is delayq.ErrLeaseLost for a lost
// lease.
func (o *Ops) Retry(ctx context.Context, db taskstate.Querier, c Claim, f Failure, delay time.Duration, hookPending bool) (RetryOutcome, error) {
	var out RetryOutcome
	applied, err := o.store.RecordFailure(ctx, db, taskstate.Failure{Key: c.Key, Attempt: f.Attempt, Err: f.Err, Stack: f.Stack, Delay: delay})
	switch {
	case err != nil:
		out.PostgresErr = err
	case !applied:
		return out, nil
	}
	out.Applied = true
	c.redis()
	dead, err := o.dq.Retry(ctx, c.Queue, c.ID, c.Token, delay, validate.ErrorSummary(f.Err))
	if err != nil {
		return out, err
	}
	if dead {
		// The death is in Redis already: a hook could not roll it back, so the
		// row is marked for the sweep instead.
		out.Dead = true
		// The run is in the attempt history already (retried): Recorded turns
		// its entry dead.
		_, out.DeadErr = o.store.RecordFailure(ctx, db, taskstate.Failure{Key: c.Key, Attempt: f.Attempt, Err: f.Err, Dead: true,
			HookPending: hookPending, Recorded: out.PostgresErr == nil})
	}
	return out, nil
}

// Kill (fail-dead) records a run's death in Postgres, then in Redis. An error
// is Postgres's: nothing was recorded, Redis untouched (the lease expires and
// the reaper settles it).
func (o *Ops) Kill(ctx context.Context, db taskstate.Querier, c Claim, f Failure) (Outcome, error) {
	applied, err := o.store.RecordFailure(ctx, db, taskstate.Failure{Key: c.Key, Attempt: f.Attempt, Err: f.Err, Stack: f.Stack, Dead: true})
	if err != nil || !applied {
		return Outcome{}, err
	}
	c.redis()
	return Outcome{Applied: true, RedisErr: o.dq.Kill(ctx, c.Queue, c.ID, c.Token, validate.ErrorSummary(f.Err))}, nil
}

// NoteLost (no transition) appends a run that failed after its lease was lost to
// the attempt history of its row at its version, whatever the row's state:
// Postgres only, and nothing but the history changes (whoever holds the task now
// decides its state).
func (o *Ops) NoteLost(ctx context.Context, db taskstate.Querier, c Claim, f Failure) error {
	_, err := o.store.NoteLost(ctx, db, c.Key, f.Attempt, f.Err)
	return err
}

// Beginner begins transactions: *pgxpool.Pool, or the worker's DB.
type Beginner interface {
	taskstate.Querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Hook runs in the transaction of a death (an OnDead hook): its writes commit
// with the death, or neither does.
type Hook func(ctx context.Context, tx pgx.Tx) error

// KillTx (fail-dead) is Kill with hook in the death's transaction, which it
// begins on db and commits. An error (the hook's, or Postgres's) means the death
// did not commit and Redis was not written.
func (o *Ops) KillTx(ctx context.Context, db Beginner, c Claim, f Failure, hook Hook) (Outcome, error) {
	record := func(ctx context.Context, tx pgx.Tx) (bool, error) {
		return o.store.RecordFailure(ctx, tx, taskstate.Failure{Key: c.Key, Attempt: f.Attempt, Err: f.Err, Stack: f.Stack, Dead: true})
	}
	return o.dieTx(ctx, db, c, record, hook, validate.ErrorSummary(f.Err))
}

// MissDeadline (miss-deadline) records dead, with reason, a task claimed after
// its start deadline, then kills it in Redis. Errors as Kill's.
func (o *Ops) MissDeadline(ctx context.Context, db taskstate.Querier, c Claim, reason string) (Outcome, error) {
	applied, err := o.store.MissDeadline(ctx, db, c.Key, reason)
	if err != nil || !applied {
		return Outcome{}, err
	}
	c.redis()
	return Outcome{Applied: true, RedisErr: o.dq.Kill(ctx, c.Queue, c.ID, c.Token, reason)}, nil
}

// MissDeadlineTx (miss-deadline) is MissDeadline with hook in its transaction,
// as KillTx.
func (o *Ops) MissDeadlineTx(ctx context.Context, db Beginner, c Claim, reason string, hook Hook) (Outcome, error) {
	record := func(ctx context.Context, tx pgx.Tx) (bool, error) {
		return o.store.MissDeadline(ctx, tx, c.Key, reason)
	}
	return o.dieTx(ctx, db, c, record, hook, reason)
}

// dieTx is the transaction of a death with a hook: record, then the hook, then
// the commit; then the kill in Redis.
func (o *Ops) dieTx(ctx context.Context, db Beginner, c Claim, record func(context.Context, pgx.Tx) (bool, error), hook Hook, msg string) (Outcome, error) {
	applied, err := func() (bool, error) {
		tx, err := db.Begin(ctx)
		if err != nil {
			return false, fmt.Errorf("begin: %w", err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		applied, err := record(ctx, tx)
		if err != nil || !applied {
			return false, err
		}
		if err := hook(ctx, tx); err != nil {
			return false, err
		}
		if err := tx.Commit(ctx); err != nil {
			// The commit may have happened all the same: the row says.
			st, rerr := o.store.Row(ctx, db, c.Queue, c.ID)
			if rerr != nil || st.State != taskstate.Dead || st.Version != c.Version {
				return false, fmt.Errorf("commit: %w", err)
			}
		}
		return true, nil
	}()
	if err != nil || !applied {
		return Outcome{}, err
	}
	c.redis()
	return Outcome{Applied: true, RedisErr: o.dq.Kill(ctx, c.Queue, c.ID, c.Token, msg)}, nil
}

// SnoozeOutcome is what Snooze did.
type SnoozeOutcome struct {
	Outcome
	// PostgresErr: recording the next run time failed; Redis was given the
	// snooze all the same, and Applied is true (Postgres keeps the older run
	// time).
	PostgresErr error
}

// Snooze (snooze) sets the run's next run time to delay from now in Postgres,
// without counting the run, then gives the lease back in Redis with that delay.
// The error is Redis's.
func (o *Ops) Snooze(ctx context.Context, db taskstate.Querier, c Claim, delay time.Duration) (SnoozeOutcome, error) {
	var out SnoozeOutcome
	applied, err := o.store.Snooze(ctx, db, c.Key, delay)
	switch {
	case err != nil:
		out.PostgresErr = err
	case !applied:
		return out, nil
	}
	out.Applied = true
	c.redis()
	return out, o.dq.ReleaseAfter(ctx, c.Queue, c.ID, c.Token, delay)
}

// CancelRun (run-cancel) records the task cancelled by its run, then completes
// it in Redis. Errors as Kill's.
func (o *Ops) CancelRun(ctx context.Context, db taskstate.Querier, c Claim, attempt int, reason string) (Outcome, error) {
	applied, err := o.store.CancelRun(ctx, db, c.Key, attempt, reason)
	if err != nil || !applied {
		return Outcome{}, err
	}
	c.redis()
	return Outcome{Applied: true, RedisErr: o.dq.Complete(ctx, c.Queue, c.ID, c.Token)}, nil
}

// Suppress (stale) settles in Redis a run whose row refused it, as row (read
// after the refusal) says: dead at this version is killed, anything else
// (finished, another version, gone) is completed, so this copy never runs again.
// Postgres is not written: it is the truth Redis follows.
func (o *Ops) Suppress(ctx context.Context, c Claim, row taskstate.RowState) error {
	c.redis()
	if row.Exists && row.State == taskstate.Dead && row.Version == c.Version {
		return o.dq.Kill(ctx, c.Queue, c.ID, c.Token, row.LastError)
	}
	return o.dq.Complete(ctx, c.Queue, c.ID, c.Token)
}

// GiveBack (stale) returns a run whose row is live at its version although its
// guard refused it (the row changed between the guard and the read) to Redis, to
// run again after delay. Postgres is not written.
func (o *Ops) GiveBack(ctx context.Context, c Claim, delay time.Duration, reason string) error {
	c.redis()
	_, err := o.dq.Retry(ctx, c.Queue, c.ID, c.Token, delay, reason)
	return err
}

// Release (release) hands the lease of a run a shutdown interrupted back to
// Redis, due at once, the run not counted. Postgres is not written: the row is
// live and unchanged.
func (o *Ops) Release(ctx context.Context, c Claim) error {
	c.redis()
	return o.dq.Release(ctx, c.Queue, c.ID, c.Token)
}

// TakeDeadHook (dead-hook) takes the next dead row of queues whose OnDead hook
// is due and clears its mark, in tx: the hook runs in it too, and a rollback
// leaves the mark. Postgres only.
func (o *Ops) TakeDeadHook(ctx context.Context, tx pgx.Tx, queues []string) (taskstate.DeadHookRow, bool, error) {
	return o.store.TakeDeadHook(ctx, tx, queues)
}

// DelayDeadHook (dead-hook) marks k again, its hook due after delay, in the
// transaction of TakeDeadHook after a hook that failed. Postgres only.
func (o *Ops) DelayDeadHook(ctx context.Context, tx pgx.Tx, k taskstate.Key, delay time.Duration) error {
	return o.store.DelayDeadHook(ctx, tx, k, delay)
}
