package taskstate

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Sort is the order of a list of the dashboard.
type Sort string

// The orders of a list. The zero Sort is the state's own order (List).
const (
	SortID       Sort = "id"       // task id, on the primary key (needs a queue)
	SortDue      Sort = "due"      // due time, the soonest first
	SortCreated  Sort = "created"  // creation time, the latest first
	SortFinished Sort = "finished" // finish time, the latest first
)

// Sorts lists the orders, for a form.
var Sorts = []Sort{SortID, SortDue, SortCreated, SortFinished}

func (s Sort) check(f Filter) error {
	switch s {
	case "", SortID:
		return nil
	case SortDue, SortCreated, SortFinished:
		if f.Prefix != "" {
			return fmt.Errorf("%w: an id prefix lists by id: sort by id, or clear the prefix", ErrBrowse)
		}
		if s.Scans(f) && f.Queue == "" {
			return fmt.Errorf("%w: sorting by %s time reads a queue's rows: choose a queue", ErrBrowse, s)
		}
		return nil
	}
	return fmt.Errorf("%w: sort %q: id, due, created or finished", ErrBrowse, string(s))
}

// Scans reports whether f's sort has no index to walk and reads every row of
// f's queue and state to sort them (the caller bounds it with a time limit): a
// sort by creation time, or by due time but for the pending rows
// (delayq_outbox_pending_run_at_idx). A sort by finish time walks
// delayq_outbox_done_at_idx, whatever the state.
func (s Sort) Scans(f Filter) bool {
	switch s {
	case SortCreated:
		return true
	case SortDue:
		return f.State != Pending
	}
	return false
}

func (b BrowseStatements) sorted(s Sort) string {
	if s == SortDue {
		return b.ByDue
	}
	return b.ByCreated
}

// searchStatements are the statements of a search by payload, for cfg's table.
type searchStatements struct {
	// scan reads the next rows of a queue in id order and tells which payloads
	// hold the needle: $1 queue, $2 the last id read ('' first), $3 the most rows
	// to read, $4 the needle, $5 state ('' any), $6 the most hits to return. It
	// returns one row: the last id read (NULL: none left), the rows read and the
	// ids of the hits, in order. The payloads are read once, and none is kept.
	scan string
	// rows reads the hits' rows with their payloads: $1 queue, $2 ids.
	rows string
}

func newSearch(cfg Config) searchStatements {
	table := cfg.Table()
	return searchStatements{
		scan: fmt.Sprintf(`WITH s AS MATERIALIZED (
	SELECT task_id, state, position($4::bytea IN payload) > 0 AS hit FROM %[1]s
	WHERE queue = $1 AND task_id > $2::text
	ORDER BY task_id
	LIMIT $3
), h AS (
	SELECT task_id FROM s WHERE hit AND ($5::text = '' OR state = $5::text) ORDER BY task_id LIMIT $6
)
SELECT (SELECT max(task_id) FROM s), (SELECT count(*) FROM s), coalesce((SELECT array_agg(task_id ORDER BY task_id) FROM h), '{}')`, table),
		rows: fmt.Sprintf(`SELECT %s, payload FROM %s WHERE queue = $1 AND task_id = ANY($2::text[]) ORDER BY task_id`, browseColumns, table),
	}
}

// SearchStep is what one step of a search by payload read.
type SearchStep struct {
	// Rows are the rows whose payload holds the needle, in id order, with their
	// payloads (for the caller to check them exactly).
	Rows     []SearchRow
	Scanned  int    // rows read
	Last     string // the id to go on after ("" when the queue has no more)
	Complete bool   // Last is the queue's last row: nothing is left to search
}

// SearchRow is a row a search found, with its whole payload.
type SearchRow struct {
	BrowseRow
	Payload []byte
}

// Search reads, in id order after the id after, at most scan rows of queue and
// returns those of state (” any) whose payload holds needle (a byte string), at
// most hits of them: a step of a search by payload whose cost is bounded by
// scan, whatever the table holds. The caller bounds its time too (a statement
// timeout) and goes on from SearchStep.Last.
func (b *Browse) Search(ctx context.Context, q Querier, queue string, state State, needle []byte, after string, scan, hits int) (SearchStep, error) {
	var st SearchStep
	if queue == "" || len(needle) == 0 || scan < 1 || hits < 1 {
		return st, fmt.Errorf("%w: a search needs a queue, a value and limits", ErrBrowse)
	}
	sq := b.search
	var last *string
	var ids []string
	if err := q.QueryRow(ctx, sq.scan, queue, after, scan, needle, string(state), hits).Scan(&last, &st.Scanned, &ids); err != nil {
		return st, fmt.Errorf("%w: search: %w", ErrBrowse, err)
	}
	switch {
	case len(ids) == hits: // hits stopped the step: go on after the last
		st.Last = ids[len(ids)-1]
	case last != nil && st.Scanned == scan:
		st.Last = *last
	default:
		st.Complete = true
	}
	if len(ids) == 0 {
		return st, nil
	}
	rows, err := q.Query(ctx, sq.rows, queue, ids)
	if err != nil {
		return st, fmt.Errorf("%w: search: %w", ErrBrowse, err)
	}
	st.Rows, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (SearchRow, error) {
		var row SearchRow
		var stt string
		var done *time.Time
		if err := r.Scan(&row.Queue, &row.ID, &stt, &row.Version, &row.Attempt, &row.MaxAttempts, &row.RunAt, &done,
			&row.LastError, &row.PayloadBytes, &row.CreatedAt, &row.Payload); err != nil {
			return row, err
		}
		if done != nil {
			row.DoneAt = *done
		}
		var err error
		row.State, err = Parse(stt)
		return row, err
	})
	if err != nil {
		return st, fmt.Errorf("%w: search: %w", ErrBrowse, err)
	}
	return st, nil
}
