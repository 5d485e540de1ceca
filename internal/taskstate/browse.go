package taskstate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayqtype"
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
	// delayq_outbox_done_at_idx: $1 queue ('' all), $2 state ('' every finished
	// one), $3 $4 $5 the cursor
	// (done_at, queue, task_id of the last row; done_at NULL first), $6 due from
	// and $7 due before (NULL: open), $8 limit.
	Finished string
	// ByDue (soonest first) and ByCreated (latest first) sort one queue's rows
	// by a column no index of theirs keys: each reads the queue's rows of the
	// state (a partial index's, for queued and dead; else the queue's range of
	// the primary key) and keeps the top of the sort, so the dashboard runs them
	// under a time limit (Sort.Scans).
	ByDue, ByCreated string
	// Keys reads the rows of the keys given, on the primary key: $1 queues and
	// $2 task ids, pairwise (a bulk action's ticked tasks).
	Keys string
}

// browseColumns are the columns every list returns, in order (BrowseRow).
const browseColumns = `queue, task_id, state, version, attempt, max_attempts, run_at, done_at, coalesce(last_error, ''), octet_length(payload), created_at`

// NewBrowse builds the dashboard's statements for cfg.
func NewBrowse(cfg Config) BrowseStatements {
	table := cfg.Table()
	due := func(from, before string) string {
		return fmt.Sprintf(`(%[1]s::timestamptz IS NULL OR run_at >= %[1]s::timestamptz) AND (%[2]s::timestamptz IS NULL OR run_at < %[2]s::timestamptz)`, from, before)
	}
	sorted := func(col, dir, cmp string) string {
		// $1 queue, $2 state ('' any), $3 $4 the cursor (the column's value and the
		// task id of the last row; $3 NULL first), $5 due from and $6 due before
		// (NULL: open), $7 limit.
		return fmt.Sprintf(`SELECT %[1]s FROM %[2]s
WHERE queue = $1 AND ($2::text = '' OR state = $2::text) AND %[3]s
  AND ($3::timestamptz IS NULL OR %[4]s %[5]s $3::timestamptz OR %[4]s = $3::timestamptz AND task_id > $4::text)
ORDER BY %[4]s %[6]s, task_id
LIMIT $7`, browseColumns, table, due("$5", "$6"), col, cmp, dir)
	}
	return BrowseStatements{
		ByDue:     sorted("run_at", "", ">"),
		ByCreated: sorted("created_at", "DESC", "<"),

		Keys: fmt.Sprintf(`SELECT %s FROM %s
WHERE (queue, task_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
ORDER BY queue, task_id`, browseColumns, table),

		Task: fmt.Sprintf(`SELECT %s, queued_at, priority, substring(payload FROM 1 FOR $3::int),
       coalesce(attempt_log, '[]'::jsonb),
       coalesce(waits_for, 0), coalesce(has_dependents, false),
       octet_length(result), substring(result FROM 1 FOR %d)
FROM %s WHERE queue = $1 AND task_id = $2`, browseColumns, ResultCap, table),

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
WHERE done_at IS NOT NULL AND ($2::text = '' OR state = $2::text) AND ($1::text = '' OR queue = $1::text)
  AND done_at <= coalesce($3::timestamptz, 'infinity')
  AND ($3::timestamptz IS NULL OR done_at < $3::timestamptz OR (queue, task_id) > ($4::text, $5::text))
  AND %s
ORDER BY done_at DESC, queue, task_id
LIMIT $8`, browseColumns, table, due("$6", "$7")),
	}
}

// Browse runs the dashboard's reads. Like Store it holds no connection.
type Browse struct {
	SQL    BrowseStatements
	search searchStatements
}

// NewBrowser returns a Browse for cfg.
func NewBrowser(cfg Config) *Browse { return &Browse{SQL: NewBrowse(cfg), search: newSearch(cfg)} }

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
	CreatedAt    time.Time
}

// TaskRow is one task's row in full, its payload cut to the size asked for.
type TaskRow struct {
	BrowseRow
	QueuedAt time.Time // zero if never queued
	Priority int       // 0..9, higher first among the queue's due tasks
	Payload  []byte    // at most the size asked for; PayloadBytes is the whole
	// Attempts is the attempt history, oldest first, with the success of a done
	// row derived (History).
	Attempts []delayqtype.Attempt
	// WaitsFor is the number of dependencies a waiting row still waits on.
	WaitsFor int
	// HasDependents: tasks were enqueued waiting on this one (the flag stays
	// once their edges settled).
	HasDependents bool
	// Result is the stored result (workflow.Client.SetResult), at most
	// ResultCap bytes of it; nil when none. ResultBytes is its whole size.
	Result      []byte
	ResultBytes int
}

// ResultCap bounds the bytes of a stored result Task reads (the client stores
// at most 4 KiB).
const ResultCap = 4 << 10

// History is the attempt history of a row: log (its column attempt_log) in
// run order (by version, then attempt), and, when the row is done, its success:
// the run after the last one of its version, recorded (the row's attempt) or in
// log, at doneAt. A run whose lease expired and ran again leaves no entry, so
// the derived number may be one short of the run's.
func History(log []delayqtype.Attempt, state State, version, attempt int, doneAt time.Time) []delayqtype.Attempt {
	slices.SortStableFunc(log, func(a, b delayqtype.Attempt) int {
		return cmp.Or(cmp.Compare(a.Version, b.Version), cmp.Compare(a.Attempt, b.Attempt))
	})
	if state != Done {
		return log
	}
	last := attempt
	for _, a := range log {
		if a.Version == version {
			last = max(last, a.Attempt)
		}
	}
	return append(log, delayqtype.Attempt{Attempt: last + 1, Version: version, At: doneAt, Outcome: "succeeded"})
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
	// Sort orders the list ("" the state's own order: see List).
	Sort Sort
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
// latest first; queued and waiting rows, and dead or cancelled rows of one queue, by id (the
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
	if err := f.Sort.check(f); err != nil {
		return nil, Cursor{}, err
	}
	switch {
	case f.Sort.Scans(f):
		sql, by = b.SQL.sorted(f.Sort), string(f.Sort)
		args = []any{f.Queue, string(f.State), ts(cur.At), cur.ID, ts(f.DueFrom), ts(f.DueBefore), limit}
	case f.Sort == SortID:
		if f.Queue == "" {
			return nil, Cursor{}, fmt.Errorf("%w: a list by id needs a queue", ErrBrowse)
		}
		sql, by = b.SQL.ByID, "id"
		args = []any{f.Queue, cur.ID, f.Prefix, string(f.State), ts(f.DueFrom), ts(f.DueBefore), limit}
	case f.Sort == SortDue:
		sql, by = b.SQL.Pending, "run_at"
		args = []any{f.Queue, ts(cur.At), cur.Queue, cur.ID, ts(f.DueFrom), ts(f.DueBefore), limit}
	case f.Sort == SortFinished:
		sql, by = b.SQL.Finished, "done_at"
		args = []any{f.Queue, string(f.State), ts(cur.At), cur.Queue, cur.ID, ts(f.DueFrom), ts(f.DueBefore), limit}
	case f.Prefix != "" || f.State == "" || f.State == Queued || f.State == Waiting || f.Queue != "" && (f.State == Dead || f.State == Cancelled):
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
		case "run_at", string(SortDue):
			next.At = last.RunAt
		case "done_at", string(SortFinished):
			next.At = last.DoneAt
		case string(SortCreated):
			next.At = last.CreatedAt
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
	var resultBytes *int
	if err := rows.Scan(&t.Queue, &t.ID, &st, &t.Version, &t.Attempt, &t.MaxAttempts, &t.RunAt, &done,
		&t.LastError, &t.PayloadBytes, &t.CreatedAt, &queued, &t.Priority, &t.Payload, &t.Attempts,
		&t.WaitsFor, &t.HasDependents, &resultBytes, &t.Result); err != nil {
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
	if resultBytes != nil {
		t.ResultBytes = *resultBytes
		if t.Result == nil {
			t.Result = []byte{}
		}
	}
	t.Attempts = History(t.Attempts, t.State, t.Version, t.Attempt, t.DoneAt)
	return t, true, rows.Err()
}

// Rows reads the rows of the keys queues[i]/ids[i], in queue and id order; a
// key without a row is left out.
func (b *Browse) Rows(ctx context.Context, q Querier, queues, ids []string) ([]BrowseRow, error) {
	if len(queues) != len(ids) {
		return nil, fmt.Errorf("%w: %d queues for %d ids", ErrBrowse, len(queues), len(ids))
	}
	rows, err := q.Query(ctx, b.SQL.Keys, queues, ids)
	if err != nil {
		return nil, fmt.Errorf("%w: rows: %w", ErrBrowse, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BrowseRow, error) {
		var row BrowseRow
		return row, scanBrowse(r, &row)
	})
	if err != nil {
		return nil, fmt.Errorf("%w: rows: %w", ErrBrowse, err)
	}
	return out, nil
}

func scanBrowse(r pgx.CollectableRow, row *BrowseRow) error {
	var st string
	var done *time.Time
	if err := r.Scan(&row.Queue, &row.ID, &st, &row.Version, &row.Attempt, &row.MaxAttempts, &row.RunAt, &done,
		&row.LastError, &row.PayloadBytes, &row.CreatedAt); err != nil {
		return err
	}
	if done != nil {
		row.DoneAt = *done
	}
	var err error
	row.State, err = Parse(st)
	return err
}
