package taskstate

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DueCount is how many live rows of a queue fall due in one minute of a window
// (DueCounts).
type DueCount struct {
	Queue string
	// Minute is the minute since the window's start: row i counts the rows due in
	// [start + i min, start + (i+1) min). -1 counts the pending rows already due
	// (waiting for the relay).
	Minute int
	Rows   int64
}

// DueCounts counts the pending and queued rows of queues (nil: every queue) due
// in the minutes after start, by queue and minute. The queued rows already due
// are not counted: they are in Redis, whose ready backlog tells them apart from
// the runs in progress. It is one statement (DueByMinute): an index range of the
// pending rows of the window, and every queued row of the queues.
func (s *Store) DueCounts(ctx context.Context, q Querier, start time.Time, minutes int, queues []string) ([]DueCount, error) {
	if minutes < 1 {
		return nil, fmt.Errorf("%w: a window of %d minutes", ErrInvalidArgument, minutes)
	}
	var (
		rows pgx.Rows
		err  error
	)
	if queues == nil {
		rows, err = q.Query(ctx, s.SQL.DueByMinute, start, minutes)
	} else {
		rows, err = q.Query(ctx, s.SQL.DueByMinuteSome, start, minutes, queues)
	}
	if err != nil {
		return nil, fmt.Errorf("count due rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DueCount, error) {
		var c DueCount
		err := r.Scan(&c.Queue, &c.Minute, &c.Rows)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("count due rows: %w", err)
	}
	return out, nil
}
