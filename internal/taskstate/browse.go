package taskstate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// BrowseStatements are the read-only statements of the operator's dashboard
// (internal/ui): lists of tasks with keyset pagination (never OFFSET), each served
// by an index of the outbox (TestBrowseQueriesUseIndexes), and one task's row.
type BrowseStatements struct {
	// Task reads one row: $1 queue, $2 task_id, $3 the most payload bytes to return.
	Task string
	// ByID lists a queue's rows in task id order on the primary key: $1 queue,
	// $2 the last id of the previous page ('' first), $3 id prefix ('' none),
	// $4 state ('' any), $5 due from and $6 due before (NULL: open), $7 limit.
	ByID string
	// Pending lists pending rows in due order on delayq_outbox_pending_run_at_idx:
	// $1 queue ('' all), $2 $3 $4 the cursor (run_at, queue, task_id of the last
	// row; run_at NULL first), $5 due from and $6 due before (NULL: open), $7 limit.
	Pending string
	// Finished lists done, dead or cancelled rows, the latest first, on
	// delayq_outbox_done_at_idx: $1 queue ('' all), $2 state, $3 $4 $5 the cursor
	// (done_at, queue, task_id of the last row; done_at NULL first), $6 due from
	// and $7 due before (NULL: open), $8 limit.
	Finished string
}

// browseColumns are the columns every list returns, in order (BrowseRow).
const browseColumns = `queue, task_id, state, version, attempt, max_attempts, run_at, done_at, coalesce(last_error, ''), octet_length(payload)`

// NewBrowse builds the dashboard's statements for cfg.
func NewBrowse(cfg Config) BrowseStatements {
	table := cfg.Table()
	due := func(from, before string) string {
		return fmt.Sprintf(`(%[1]s::timestamptz IS NULL OR run_at >= %[1]s::timestamptz) AND (%[2]s::timestamptz IS NULL OR run_at < %[2]s::timestamptz)`, from, before)
	}
	return BrowseStatements{
		Task: fmt.Sprintf(`SELECT %s, created_at, queued_at, priority, substring(payload FROM 1 FOR $3::int)
FROM %s WHERE queue = $1 AND task_id = $2`, browseColumns, table),

		// The prefix is both an index bound (task_id >= $3) and the filter.
		ByID: fmt.Sprintf(`SELECT %s FROM %s
WHERE queue = $1 AND task_id > $2::text AND task_id >= $3::text AND starts_with(task_id, $3::text)
  AND ($4::text = '' OR state = $4::text) AND %s
ORDER BY task_id
LIMIT $7`, browseColumns, table, due("$5", "$6")),

		// The cursor's first column is the index bound; the others break ties.
		Pending: fmt.Sprintf(`SELECT %s FROM %s
WHERE state = 'pending' AND ($1::text = '' OR queue = $1::text)
  AND run_at >= coalesce($2::timestamptz, '-infinity')
  AND ($2::timestamptz IS NULL OR run_at > $2::timestamptz OR (queue, task_id) > ($3::text, $4::text))
  AND run_at >= coalesce($5::timestamptz, '-infinity') AND run_at < coalesce($6::timestamptz, 'infinity')
ORDER BY run_at, queue, task_id
LIMIT $7`, browseColumns, table),

		Finished: fmt.Sprintf(`SELECT %s FROM %s
WHERE done_at IS NOT NULL AND state = $2::text AND ($1::text = '' OR queue = $1::text)
  AND done_at <= coalesce($3::timestamptz, 'infinity')
  AND ($3::timestamptz IS NULL OR done_at < $3::timestamptz OR (queue, task_id) > ($4::text, $5::text))
  AND %s
ORDER BY done_at DESC, queue, task_id
LIMIT $8`, browseColumns, table, due("$6", "$7")),
	}
}

// Browse runs the dashboard's reads. Like Store it holds no connection.
type Browse struct {
	SQL BrowseStatements
}

// NewBrowser returns a Browse for cfg.
func NewBrowser(cfg Config) *Browse { return &Browse{SQL: NewBrowse(cfg)} }

// BrowseRow is one row of a list.
type BrowseRow struct {
	Queue, ID   string
	State       State
	Version     int
	Attempt     int
	MaxAttempts int
	RunAt       time.Time
	// DoneAt is when the row finished (zero while live).
	DoneAt       time.Time
	LastError    string
	PayloadBytes int
}

// TaskRow is one task's row in full, its payload cut to the size asked for.
type TaskRow struct {
	BrowseRow
	CreatedAt time.Time
	QueuedAt  time.Time // zero if never queued
	Priority  int       // 0..9, higher first among the queue's due tasks
	Payload   []byte    // at most the size asked for; PayloadBytes is the whole
}

// Cursor is where a page ends: the next page starts after it. The zero Cursor
// is the first page.
type Cursor struct {
	At        time.Time // run_at (pending) or done_at (finished); unused by id
	Queue, ID string
}

// Filter selects rows of a list.
type Filter struct {
	// Queue: '' for every queue (not for ByID, which needs one).
	Queue string
	// State: '' for any.
	State State
	// Prefix of the task id ('' none). Lists by id only.
	Prefix string
	// DueFrom, DueBefore bound run_at (zero: open).
	DueFrom, DueBefore time.Time
}

func ts(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// ErrBrowse reports a filter a list cannot serve.
var ErrBrowse = errors.New("taskstate: browse")

// List lists up to limit rows after cur, choosing the statement whose index
// serves f: with a prefix or without a state, the queue's rows by id; pending
// rows by due time; done rows, and dead or cancelled rows of every queue, the
// latest first; queued rows, and dead or cancelled rows of one queue, by id (the
// primary key's range of the queue: those rows are too sparse among the
// finished ones for the done_at index to find a page quickly). It returns the
// cursor of the next page (zero when this was the last).
func (b *Browse) List(ctx context.Context, q Querier, f Filter, cur Cursor, limit int) ([]BrowseRow, Cursor, error) {
	if limit < 1 || limit > 1000 {
		return nil, Cursor{}, fmt.Errorf("%w: limit %d outside 1..1000", ErrBrowse, limit)
	}
	if f.State != "" {
		if _, err := Parse(string(f.State)); err != nil {
			return nil, Cursor{}, fmt.Errorf("%w: %w", ErrBrowse, err)
		}
	}
	var (
		sql  string
		args []any
		by   string
	)
	switch {
	case f.Prefix != "" || f.State == "" || f.State == Queued || f.Queue != "" && (f.State == Dead || f.State == Cancelled):
		if f.Queue == "" {
			return nil, Cursor{}, fmt.Errorf("%w: a list by id needs a queue", ErrBrowse)
		}
		sql, by = b.SQL.ByID, "id"
		args = []any{f.Queue, cur.ID, f.Prefix, string(f.State), ts(f.DueFrom), ts(f.DueBefore), limit}
	case f.State == Pending:
		sql, by = b.SQL.Pending, "run_at"
		args = []any{f.Queue, ts(cur.At), cur.Queue, cur.ID, ts(f.DueFrom), ts(f.DueBefore), limit}
	default:
		sql, by = b.SQL.Finished, "done_at"
		args = []any{f.Queue, string(f.State), ts(cur.At), cur.Queue, cur.ID, ts(f.DueFrom), ts(f.DueBefore), limit}
	}
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, Cursor{}, fmt.Errorf("%w: list: %w", ErrBrowse, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BrowseRow, error) {
		var row BrowseRow
		return row, scanBrowse(r, &row)
	})
	if err != nil {
		return nil, Cursor{}, fmt.Errorf("%w: list: %w", ErrBrowse, err)
	}
	var next Cursor
	if len(out) == limit {
		last := out[len(out)-1]
		next = Cursor{Queue: last.Queue, ID: last.ID}
		switch by {
		case "run_at":
			next.At = last.RunAt
		case "done_at":
			next.At = last.DoneAt
		}
	}
	return out, next, nil
}

// Task reads the row of queue/id with at most payloadCap bytes of its payload;
// ok is false when there is none.
func (b *Browse) Task(ctx context.Context, q Querier, queue, id string, payloadCap int) (TaskRow, bool, error) {
	var t TaskRow
	var queued *time.Time
	rows, err := q.Query(ctx, b.SQL.Task, queue, id, max(payloadCap, 0))
	if err != nil {
		return t, false, fmt.Errorf("%w: task %s/%s: %w", ErrBrowse, queue, id, err)
	}
	defer rows.Close()
	if !rows.Next() {
		return t, false, rows.Err()
	}
	var st string
	var done *time.Time
	if err := rows.Scan(&t.Queue, &t.ID, &st, &t.Version, &t.Attempt, &t.MaxAttempts, &t.RunAt, &done,
		&t.LastError, &t.PayloadBytes, &t.CreatedAt, &queued, &t.Priority, &t.Payload); err != nil {
		return t, false, fmt.Errorf("%w: task %s/%s: %w", ErrBrowse, queue, id, err)
	}
	if t.State, err = Parse(st); err != nil {
		return t, false, err
	}
	if done != nil {
		t.DoneAt = *done
	}
	if queued != nil {
		t.QueuedAt = *queued
	}
	return t, true, rows.Err()
}

func scanBrowse(r pgx.CollectableRow, row *BrowseRow) error {
	var st string
	var done *time.Time
	if err := r.Scan(&row.Queue, &row.ID, &st, &row.Version, &row.Attempt, &row.MaxAttempts, &row.RunAt, &done,
		&row.LastError, &row.PayloadBytes); err != nil {
		return err
	}
	if done != nil {
		row.DoneAt = *done
	}
	var err error
	row.State, err = Parse(st)
	return err
}
