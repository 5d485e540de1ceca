package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
)

// QueueStats are the counts of one queue in both stores.
type QueueStats struct {
	Queue string `json:"queue"`
	// Postgres counts the outbox rows by state; every state is present.
	Postgres map[string]int64 `json:"postgres"`
	// Redis counts, read atomically on the Redis clock.
	Ready         int64 `json:"redis_ready"`
	DueNow        int64 `json:"redis_due_now"`
	Active        int64 `json:"redis_active"`
	ExpiredLeases int64 `json:"redis_expired_leases"`
	Dead          int64 `json:"redis_dead"`
	// Overdue counts the ready tasks in Redis due more than OverdueAfter (a
	// minute) ago and not claimed: nobody serves the queue, or its workers fall
	// behind.
	Overdue int64 `json:"redis_overdue"`
	// OldestPendingAge is how long the oldest due pending row has waited for the
	// relay since its run time (database clock): the relay lag. 0 when none is due.
	// In JSON: oldest_pending_age_ms.
	OldestPendingAge time.Duration `json:"-"`
	// OldestDueLateness is how long the earliest ready task in Redis has been due
	// (Redis clock): the worker lag. 0 when none is due. In JSON:
	// oldest_due_lateness_ms.
	OldestDueLateness time.Duration `json:"-"`
}

// MarshalJSON writes the durations as whole milliseconds.
func (s QueueStats) MarshalJSON() ([]byte, error) {
	type plain QueueStats
	return json.Marshal(struct {
		plain
		OldestPendingMS int64 `json:"oldest_pending_age_ms"`
		OldestDueMS     int64 `json:"oldest_due_lateness_ms"`
	}{plain(s), s.OldestPendingAge.Milliseconds(), s.OldestDueLateness.Milliseconds()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *QueueStats) UnmarshalJSON(b []byte) error {
	type plain QueueStats
	var v struct {
		plain
		OldestPendingMS int64 `json:"oldest_pending_age_ms"`
		OldestDueMS     int64 `json:"oldest_due_lateness_ms"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*s = QueueStats(v.plain)
	s.OldestPendingAge = time.Duration(v.OldestPendingMS) * time.Millisecond
	s.OldestDueLateness = time.Duration(v.OldestDueMS) * time.Millisecond
	return nil
}

// OverdueAfter is how long past its due time a ready task counts as overdue in
// QueueStats (the relay's delayq_relay_overdue_tasks default too).
const OverdueAfter = time.Minute

// States lists the outbox states in their lifecycle order.
func States() []string {
	return []string{statePending, stateQueued, stateDone, stateDead, stateCancelled}
}

// Stats counts each queue (Options.Queues, or every queue of the outbox and of
// Redis) in Postgres and in Redis. The Postgres counts read every row of the
// queues: an operator's command, not a metric to scrape often.
func Stats(ctx context.Context, db DB, dq *delayq.Client, opts Options) ([]QueueStats, error) {
	if db == nil || dq == nil {
		return nil, fmt.Errorf("%w: nil database or Redis client", ErrInvalidOptions)
	}
	o, st, err := opts.prepare()
	if err != nil {
		return nil, err
	}
	qs, err := queuesOf(ctx, db, dq, st, o.Queues, o.Deep)
	if err != nil {
		return nil, err
	}
	out := make([]QueueStats, len(qs))
	byQueue := make(map[string]*QueueStats, len(qs))
	for i, q := range qs {
		out[i] = QueueStats{Queue: q, Postgres: map[string]int64{}}
		for _, s := range States() {
			out[i].Postgres[s] = 0
		}
		byQueue[q] = &out[i]
	}
	counts, lag := st.StateCounts, st.PendingLag
	var args []any
	if o.Queues != nil {
		counts, lag, args = st.StateCountsSome, st.PendingLagSome, []any{qs}
	}
	rows, err := db.Query(ctx, counts, args...)
	if err != nil {
		return nil, fmt.Errorf("reconcile: stats: %w", err)
	}
	var q, state string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&q, &state, &n}, func() error {
		if s := byQueue[q]; s != nil {
			s.Postgres[state] = n
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reconcile: stats: %w", err)
	}
	rows, err = db.Query(ctx, lag, args...)
	if err != nil {
		return nil, fmt.Errorf("reconcile: stats: %w", err)
	}
	var secs float64
	_, err = pgx.ForEachRow(rows, []any{&q, &secs}, func() error {
		if s := byQueue[q]; s != nil && secs > 0 && !math.IsInf(secs, 0) {
			s.OldestPendingAge = time.Duration(secs * float64(time.Second))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reconcile: stats: %w", err)
	}
	for i := range out {
		s := &out[i]
		rs, err := dq.Stats(ctx, s.Queue)
		if err != nil {
			return nil, fmt.Errorf("reconcile: %w", err)
		}
		s.Ready, s.DueNow, s.Active, s.ExpiredLeases, s.Dead = rs.Ready, rs.DueNow, rs.Active, rs.ExpiredLeases, rs.Dead
		if s.Overdue, err = dq.Overdue(ctx, s.Queue, OverdueAfter); err != nil {
			return nil, fmt.Errorf("reconcile: %w", err)
		}
		s.OldestDueLateness = rs.OldestLateness
	}
	return out, nil
}
