package reconcile

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
)

type QueueStats = delayqtype.QueueStats

// OverdueAfter is how long past its due time a ready task counts as overdue in
// QueueStats (the relay's delayq_relay_overdue_tasks default too).
const OverdueAfter = time.Minute

// EstimateFinishedAbove is the outbox size (in rows, by the planner's estimate)
// above which Stats estimates the done and cancelled rows instead of counting
// them, unless Options.ExactCounts. Below it an exact count reads the whole table
// in a few tens of milliseconds.
const EstimateFinishedAbove = 50000

// Stats counts each queue (Options.Queues, or every queue of the outbox and of
// Redis) in Postgres and in Redis. The delayq stats command and the dashboard
// both show what it returns.
//
// Its cost does not grow with the finished rows: the pending, queued and dead
// rows are counted exactly, each over its partial index (index-only scans); the
// done and cancelled rows are counted exactly too while the outbox holds fewer than
// EstimateFinishedAbove rows, and above that estimated from the planner's
// statistics (QueueStats.Estimated), unless Options.ExactCounts. The Redis side is
// read in two pipelined round trips for all queues, beside the Postgres reads.
func Stats(ctx context.Context, db DB, dq *dispatch.Client, opts Options) ([]QueueStats, error) {
	if db == nil || dq == nil {
		return nil, fmt.Errorf("%w: nil database or Redis client", ErrInvalidOptions)
	}
	o, st, err := opts.prepare()
	if err != nil {
		return nil, err
	}
	qs, err := queuesOf(ctx, db, dq, st, o)
	if err != nil {
		return nil, err
	}
	out := make([]QueueStats, len(qs))
	byQueue := make(map[string]*QueueStats, len(qs))
	for i, q := range qs {
		out[i] = QueueStats{Queue: q, Postgres: map[delayqtype.State]int64{}}
		for _, s := range delayqtype.States() {
			out[i].Postgres[s] = 0
		}
		byQueue[q] = &out[i]
	}
	var (
		rs    []dispatch.QueueStats
		rsErr error
		wg    sync.WaitGroup
	)
	wg.Go(func() { rs, rsErr = dq.StatsMany(ctx, OverdueAfter, qs...) })
	pgErr := postgresStats(ctx, db, st, o, qs, byQueue)
	wg.Wait()
	if pgErr != nil {
		return nil, fmt.Errorf("reconcile: stats: %w", pgErr)
	}
	if rsErr != nil {
		return nil, fmt.Errorf("reconcile: %w", rsErr)
	}
	for i, r := range rs {
		s := &out[i]
		s.Ready, s.DueNow, s.Active, s.ExpiredLeases, s.Dead = r.Ready, r.DueNow, r.Active, r.ExpiredLeases, r.Dead
		s.Overdue, s.OldestDueLateness = r.Overdue, r.OldestLateness
	}
	return out, nil
}

// postgresStats fills the Postgres counts and the relay lag of byQueue. The live
// counts, the estimate of the finished rows and the lag are read in one round
// trip; the exact count of every row, when needed, after.
func postgresStats(ctx context.Context, db DB, st taskstate.Statements, o Options, qs []string, byQueue map[string]*QueueStats) error {
	live, lag := st.LiveCounts, st.PendingLag
	var args []any
	if o.Queues != nil {
		live, lag, args = st.LiveCountsSome, st.PendingLagSome, []any{qs}
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// Each count is a short index-only scan: parallel workers cost more to start
	// than they save, the more so on a busy server. (A transaction for SET LOCAL
	// alone: db may be a pool.)
	b := &pgx.Batch{}
	b.Queue(`SET LOCAL max_parallel_workers_per_gather = 0`)
	type estimate struct {
		queue string
		state delayqtype.State
		freq  float64
	}
	var (
		rows      float64
		estimates []estimate
		q         string
		state     delayqtype.State
		n         int64
	)
	b.Queue(st.FinishedEstimate, o.Schema).Query(func(r pgx.Rows) error {
		var eq, es pgtype.Text
		var f pgtype.Float8
		_, err := pgx.ForEachRow(r, []any{&rows, &eq, &es, &f}, func() error {
			if eq.Valid && es.Valid && f.Valid {
				estimates = append(estimates, estimate{eq.String, delayqtype.State(es.String), f.Float64})
			}
			return nil
		})
		return err
	})
	b.Queue(live, args...).Query(func(r pgx.Rows) error {
		_, err := pgx.ForEachRow(r, []any{&q, &state, &n}, func() error {
			if s := byQueue[q]; s != nil {
				s.Postgres[state] = n
			}
			return nil
		})
		return err
	})
	b.Queue(lag, args...).Query(func(r pgx.Rows) error {
		var secs float64
		_, err := pgx.ForEachRow(r, []any{&q, &secs}, func() error {
			if s := byQueue[q]; s != nil && secs > 0 && !math.IsInf(secs, 0) {
				s.OldestPendingAge = time.Duration(secs * float64(time.Second))
			}
			return nil
		})
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	above := float64(EstimateFinishedAbove)
	if o.estimateAbove > 0 {
		above = o.estimateAbove
	}
	if !o.ExactCounts && rows >= above && len(estimates) > 0 {
		for _, s := range byQueue {
			s.Estimated = true
		}
		for _, e := range estimates {
			if s := byQueue[e.queue]; s != nil {
				s.Postgres[e.state] = int64(math.Round(e.freq * rows))
			}
		}
		return nil
	}
	// Exact: every row of the queues, the live ones again in this later snapshot.
	counts := st.StateCounts
	if o.Queues != nil {
		counts = st.StateCountsSome
	}
	r, err := db.Query(ctx, counts, args...)
	if err != nil {
		return err
	}
	for _, s := range byQueue {
		for k := range s.Postgres {
			s.Postgres[k] = 0
		}
	}
	_, err = pgx.ForEachRow(r, []any{&q, &state, &n}, func() error {
		if s := byQueue[q]; s != nil {
			s.Postgres[state] = n
		}
		return nil
	})
	return err
}
