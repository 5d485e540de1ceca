package taskstate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/delayq/delayq/internal/validate"
)

// ErrInvalidArgument reports a key or an attempt that no row can have; nothing was
// sent.
var ErrInvalidArgument = errors.New("taskstate: invalid argument")

// Querier runs SQL: pgx.Tx, *pgxpool.Pool, *pgxpool.Conn and *pgx.Conn satisfy it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store runs the transitions of the outbox table whose logic is more than one
// statement's. It holds no connection: every call takes the Querier to run on.
type Store struct {
	cfg Config
	SQL Statements
}

// New returns a Store for cfg.
func New(cfg Config) *Store { return &Store{cfg: cfg, SQL: NewStatements(cfg)} }

// Config returns the configuration the statements were built with.
func (s *Store) Config() Config { return s.cfg }

// Table returns the quoted, schema-qualified outbox table.
func (s *Store) Table() string { return s.cfg.Table() }

// Key names one version of a task.
type Key struct {
	Queue, ID string
	Version   int
}

// Completion is one run's completion, for MarkDoneMany.
type Completion struct {
	Key
	// ClearPayload empties the payload of the done row (also when the outbox is
	// not configured to).
	ClearPayload bool
}

// RowState is a task's row as it is now.
type RowState struct {
	Exists    bool
	State     State
	Version   int
	LastError string
	// StartBy is the task's start deadline (zero: none). Row reads it; Rows does
	// not.
	StartBy time.Time
}

// Finished reports whether the task needs no run any more: finished, or gone.
func (r RowState) Finished() bool { return !r.Exists || r.State.Finished() }

// Row reads the row of queue/id.
func (s *Store) Row(ctx context.Context, q Querier, queue, id string) (RowState, error) {
	var (
		r  RowState
		st string
	)
	var startBy *time.Time
	err := q.QueryRow(ctx, s.SQL.Row, queue, id).Scan(&st, &r.Version, &r.LastError, &startBy)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return RowState{}, nil
	case err != nil:
		return RowState{}, fmt.Errorf("read outbox row %s/%s: %w", queue, id, err)
	}
	r.Exists = true
	if startBy != nil {
		r.StartBy = *startBy
	}
	if r.State, err = Parse(st); err != nil {
		return RowState{}, err
	}
	return r, nil
}

// Rows reads the rows of ids in queue; an id without a row is absent from the map.
func (s *Store) Rows(ctx context.Context, q Querier, queue string, ids []string) (map[string]RowState, error) {
	rows, err := q.Query(ctx, s.SQL.Rows, queue, ids)
	if err != nil {
		return nil, fmt.Errorf("read outbox rows of %s: %w", queue, err)
	}
	out := make(map[string]RowState, len(ids))
	var (
		id, st string
		r      RowState
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &st, &r.Version, &r.LastError}, func() error {
		var err error
		r.Exists = true
		if r.State, err = Parse(st); err != nil {
			return err
		}
		out[id] = r
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read outbox rows of %s: %w", queue, err)
	}
	return out, nil
}

// CountByState counts the outbox rows by state, over every queue (every state is
// in the map). It reads the whole table: for reports, not for a hot path.
func (s *Store) CountByState(ctx context.Context, q Querier) (map[State]int64, error) {
	rows, err := q.Query(ctx, s.SQL.StateCounts)
	if err != nil {
		return nil, fmt.Errorf("count outbox rows: %w", err)
	}
	out := make(map[State]int64, len(States))
	for _, st := range States {
		out[st] = 0
	}
	var (
		queue, st string
		n         int64
	)
	_, err = pgx.ForEachRow(rows, []any{&queue, &st, &n}, func() error {
		state, err := Parse(st)
		out[state] += n
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("count outbox rows: %w", err)
	}
	return out, nil
}

// MarkDone is the completion guard on its own: it marks k done if, and only if, it is
// still pending or queued at this version, and reports whether it did. In the
// transaction of a handler's writes, false means: roll back.
func (s *Store) MarkDone(ctx context.Context, q Querier, k Key, clearPayload bool) (bool, error) {
	if err := checkKey(k); err != nil {
		return false, err
	}
	tag, err := q.Exec(ctx, s.SQL.Guard, k.Queue, k.ID, int32(k.Version), clearPayload)
	if err != nil {
		return false, fmt.Errorf("mark done %s/%s: %w", k.Queue, k.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// RefusedByGuard tells GuardAbort's refusal (its division by zero) from other errors.
func RefusedByGuard(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "22012" // division_by_zero
}

// MarkDoneMany is MarkDone for many tasks in one statement: applied[i] tells
// whether done[i] was marked done.
func (s *Store) MarkDoneMany(ctx context.Context, q Querier, done []Completion) (applied []bool, err error) {
	n := len(done)
	queues, ids, versions, clear := make([]string, n), make([]string, n), make([]int32, n), make([]bool, n)
	index := make(map[[2]string]int, n)
	for i, c := range done {
		if err := checkKey(c.Key); err != nil {
			return nil, err
		}
		queues[i], ids[i], versions[i], clear[i] = c.Queue, c.ID, int32(c.Version), c.ClearPayload
		index[[2]string{c.Queue, c.ID}] = i
	}
	applied = make([]bool, n)
	rows, err := q.Query(ctx, s.SQL.GuardMany, queues, ids, versions, clear)
	if err != nil {
		return nil, fmt.Errorf("mark done (%d tasks): %w", n, err)
	}
	var queue, id string
	_, err = pgx.ForEachRow(rows, []any{&queue, &id}, func() error {
		applied[index[[2]string{queue, id}]] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("mark done (%d tasks): %w", n, err)
	}
	return applied, nil
}

// QueueGuardGroup queues on b the guards of a group commit's runs (GuardGroup):
// done[i] is run i's completion, wrote[i] says its handler sent statements in the
// transaction. When b has run, applied[i] tells whether done[i] was marked done.
// If the guard of a run that wrote is refused, the statement fails instead
// (RefusedByGuard), aborting the transaction and whatever b queues after it.
func (s *Store) QueueGuardGroup(b *pgx.Batch, done []Completion, wrote, applied []bool) error {
	n := len(done)
	if len(wrote) != n || len(applied) != n {
		return fmt.Errorf("%w: %d completions, %d wrote flags, %d results", ErrInvalidArgument, n, len(wrote), len(applied))
	}
	queues, ids, versions, clear := make([]string, n), make([]string, n), make([]int32, n), make([]bool, n)
	for i, c := range done {
		if err := checkKey(c.Key); err != nil {
			return err
		}
		queues[i], ids[i], versions[i], clear[i] = c.Queue, c.ID, int32(c.Version), c.ClearPayload
	}
	b.Queue(s.SQL.GuardGroup, queues, ids, versions, clear, wrote).Query(func(rows pgx.Rows) error {
		var i *int64
		_, err := pgx.ForEachRow(rows, []any{&i}, func() error {
			if i != nil && *i >= 1 && *i <= int64(n) {
				applied[*i-1] = true
			}
			return nil
		})
		return err
	})
	return nil
}

// Failure is one failed run, for RecordFailure.
type Failure struct {
	Key
	// Attempt is the run that failed (1 for the first).
	Attempt int
	// Err is the error; a summary of it is kept (validate.ErrorSummary).
	Err string
	// Dead makes the task dead; else it runs again after Delay.
	Dead  bool
	Delay time.Duration
	// HookPending marks a death whose OnDead hook did not run in its
	// transaction: a worker's sweep runs it (TakeDeadHook).
	HookPending bool
	// Stack is a panic's stack, kept in the attempt history (cut to
	// validate.MaxStackBytes); "" for none.
	Stack string
	// Recorded: this run is in the attempt history already (its retry was
	// recorded, then Redis counted its attempts out): its entry turns dead and
	// nothing is appended.
	Recorded bool
}

// RecordFailure records a failed run: its attempt and error and, for a retry, the
// time of the next run (so a Redis rebuilt from Postgres keeps the backoff); with
// Dead, the task becomes dead. Like MarkDone it changes nothing, and returns false,
// unless the task is still pending or queued at this version.
func (s *Store) RecordFailure(ctx context.Context, q Querier, f Failure) (bool, error) {
	if err := checkKey(f.Key); err != nil {
		return false, err
	}
	if f.Attempt < 0 || f.Attempt > validate.MaxAttempts {
		return false, fmt.Errorf("%w: record failure %s/%s: attempt %d outside 0..%d", ErrInvalidArgument, f.Queue, f.ID, f.Attempt, validate.MaxAttempts)
	}
	var logErr, stack *string
	if !f.Recorded {
		logErr = ptr(validate.Cut(f.Err, validate.MaxAttemptErrorBytes))
		if f.Stack != "" {
			stack = ptr(validate.Cut(f.Stack, validate.MaxStackBytes))
		}
	}
	tag, err := q.Exec(ctx, s.SQL.RecordFailure, f.Queue, f.ID, int32(f.Version), int32(f.Attempt),
		validate.ErrorSummary(f.Err), f.Dead, max(f.Delay, 0).Microseconds(), f.HookPending, logErr, stack)
	if err != nil {
		return false, fmt.Errorf("record failure %s/%s: %w", f.Queue, f.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

func ptr(s string) *string { return &s }

// NoteLost appends a run that failed after its lease was lost (attempt, its
// error) to the attempt history of k's row at k's version, whatever its state,
// changing nothing else; it reports whether the row was there.
func (s *Store) NoteLost(ctx context.Context, q Querier, k Key, attempt int, msg string) (bool, error) {
	if err := checkKey(k); err != nil {
		return false, err
	}
	if attempt < 0 || attempt > validate.MaxAttempts {
		return false, fmt.Errorf("%w: note lost run %s/%s: attempt %d outside 0..%d", ErrInvalidArgument, k.Queue, k.ID, attempt, validate.MaxAttempts)
	}
	tag, err := q.Exec(ctx, s.SQL.NoteLost, k.Queue, k.ID, int32(k.Version), int32(attempt), validate.Cut(msg, validate.MaxAttemptErrorBytes))
	if err != nil {
		return false, fmt.Errorf("note lost run %s/%s: %w", k.Queue, k.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

func checkKey(k Key) error {
	if err := errors.Join(validate.Queue(k.Queue), validate.TaskID(k.ID)); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if k.Version < 1 || k.Version > validate.MaxVersion {
		return fmt.Errorf("%w: version %d outside 1..%d", ErrInvalidArgument, k.Version, validate.MaxVersion)
	}
	return nil
}

// Snooze sets the next run time of k to delay from now, without counting the run,
// if k is still pending or queued at its version; it reports whether it did.
func (s *Store) Snooze(ctx context.Context, q Querier, k Key, delay time.Duration) (bool, error) {
	if err := checkKey(k); err != nil {
		return false, err
	}
	tag, err := q.Exec(ctx, s.SQL.Snooze, k.Queue, k.ID, int32(k.Version), max(delay, 0).Microseconds())
	if err != nil {
		return false, fmt.Errorf("snooze %s/%s: %w", k.Queue, k.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// CancelRun marks k cancelled by its run number attempt, with reason, if it is
// still pending or queued at its version; it reports whether it did.
func (s *Store) CancelRun(ctx context.Context, q Querier, k Key, attempt int, reason string) (bool, error) {
	if err := checkKey(k); err != nil {
		return false, err
	}
	if attempt < 0 || attempt > validate.MaxAttempts {
		return false, fmt.Errorf("%w: cancel %s/%s: attempt %d outside 0..%d", ErrInvalidArgument, k.Queue, k.ID, attempt, validate.MaxAttempts)
	}
	tag, err := q.Exec(ctx, s.SQL.CancelRun, k.Queue, k.ID, int32(k.Version), int32(attempt), validate.ErrorSummary(reason),
		validate.Cut(reason, validate.MaxAttemptErrorBytes))
	if err != nil {
		return false, fmt.Errorf("cancel %s/%s: %w", k.Queue, k.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// MissDeadline records k dead with reason because a claim came after its start
// deadline, if it is still pending or queued at its version and has a deadline;
// it reports whether it did.
func (s *Store) MissDeadline(ctx context.Context, q Querier, k Key, reason string) (bool, error) {
	if err := checkKey(k); err != nil {
		return false, err
	}
	tag, err := q.Exec(ctx, s.SQL.MissDeadline, k.Queue, k.ID, int32(k.Version), validate.ErrorSummary(reason))
	if err != nil {
		return false, fmt.Errorf("miss deadline %s/%s: %w", k.Queue, k.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// SQLExecer runs a statement on database/sql: *sql.Tx, *sql.DB and *sql.Conn
// satisfy it.
type SQLExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// MarkDoneSQL is MarkDone on database/sql, for a handler's *sql.Tx.
func (s *Store) MarkDoneSQL(ctx context.Context, q SQLExecer, k Key, clearPayload bool) (bool, error) {
	if err := checkKey(k); err != nil {
		return false, err
	}
	res, err := q.ExecContext(ctx, s.SQL.Guard, k.Queue, k.ID, int32(k.Version), clearPayload)
	if err != nil {
		return false, fmt.Errorf("mark done %s/%s: %w", k.Queue, k.ID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("mark done %s/%s: %w", k.Queue, k.ID, err)
	}
	return n == 1, nil
}

// DeadHookRow is a dead task whose OnDead hook is still to run, as TakeDeadHook
// took it.
type DeadHookRow struct {
	Key
	Attempt, MaxAttempts int
	RunAt                time.Time
	Payload              []byte
	LastError            string
	TraceContext         string
	StartBy              time.Time // zero: none
	DiedAt               time.Time
}

// TakeDeadHook takes the next dead row of queues whose hook is due and clears
// its mark, in q's transaction: the hook runs in it too, and a rollback leaves
// the mark. Rows other transactions hold are skipped. ok is false when no mark
// is due.
func (s *Store) TakeDeadHook(ctx context.Context, q Querier, queues []string) (r DeadHookRow, ok bool, err error) {
	var (
		version, attempt, maxAttempts int32
		startBy                       *time.Time
		diedAt                        *time.Time
	)
	err = q.QueryRow(ctx, s.SQL.TakeDeadHook, queues).Scan(&r.Queue, &r.ID, &version, &attempt, &maxAttempts,
		&r.RunAt, &r.Payload, &r.LastError, &r.TraceContext, &startBy, &diedAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return DeadHookRow{}, false, nil
	case err != nil:
		return DeadHookRow{}, false, fmt.Errorf("take a dead hook: %w", err)
	}
	r.Version, r.Attempt, r.MaxAttempts = int(version), int(attempt), int(maxAttempts)
	if startBy != nil {
		r.StartBy = *startBy
	}
	if diedAt != nil {
		r.DiedAt = *diedAt
	}
	return r, true, nil
}

// DelayDeadHook marks k again, its hook due after delay: in the transaction of
// TakeDeadHook, after a hook that failed. k is not validated: it is a row's, and
// a row the relay refused as invalid may hold a key no task can have.
func (s *Store) DelayDeadHook(ctx context.Context, q Querier, k Key, delay time.Duration) error {
	if _, err := q.Exec(ctx, s.SQL.DelayDeadHook, k.Queue, k.ID, int32(k.Version), max(delay, 0).Microseconds()); err != nil {
		return fmt.Errorf("delay the dead hook of %s/%s: %w", k.Queue, k.ID, err)
	}
	return nil
}

// NextDeadHook tells how long until the earliest mark of queues falls due: ok
// false when there is none; a wait of 0 when one is due now (held by another
// sweep).
func (s *Store) NextDeadHook(ctx context.Context, q Querier, queues []string) (wait time.Duration, ok bool, err error) {
	var us *int64
	if err := q.QueryRow(ctx, s.SQL.NextDeadHook, queues).Scan(&us); err != nil {
		return 0, false, fmt.Errorf("next dead hook: %w", err)
	}
	if us == nil {
		return 0, false, nil
	}
	return max(time.Duration(*us)*time.Microsecond, 0), true, nil
}
