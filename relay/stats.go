package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/relayobs"
)

// depthCap bounds the exact counts of pending, queued and dead rows: past it a
// gauge reads "at least depthCap", and a refresh costs the same however large the
// backlog grows.
const depthCap = 100_000

// statsLoop refreshes the depth, lag and overdue gauges every StatsInterval.
func (r *Relay) statsLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.StatsInterval)
	defer t.Stop()
	for {
		if err := r.refreshStats(ctx); err != nil && ctx.Err() == nil {
			r.pgErr(errStats, "stats", err) //nolint:errcheck // counted and logged
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refreshStats reads the outbox depth: pending, queued and dead exactly (up to
// depthCap) from their partial indexes; done and cancelled as the planner's
// estimates, which cost nothing whatever the size of the table.
func (r *Relay) refreshStats(ctx context.Context) error {
	if _, err := r.untilNext(ctx); err != nil {
		return err
	}
	var pending, queued, dead int64
	if err := r.pool.QueryRow(ctx, r.sql.DepthLive, depthCap).Scan(&pending, &queued, &dead); err != nil {
		return err
	}
	r.refreshOverdue(ctx)
	rows, err := r.pool.Query(ctx, r.sql.DepthFinished, r.cfg.Schema)
	if err != nil {
		return err
	}
	estimates := map[delayqtype.State]int64{delayqtype.StateDone: 0, delayqtype.StateCancelled: 0}
	var (
		state delayqtype.State
		n     int64
	)
	_, err = pgx.ForEachRow(rows, []any{&state, &n}, func() error {
		estimates[state] = n
		return nil
	})
	if err != nil {
		return err
	}
	r.observe(ctx, relayobs.DepthEvent{Pending: pending, Queued: queued, Dead: dead,
		Done: estimates[delayqtype.StateDone], Cancelled: estimates[delayqtype.StateCancelled]})
	return nil
}

// refreshOverdue sets the overdue gauge of every queue the reaper visits.
func (r *Relay) refreshOverdue(ctx context.Context) {
	for _, q := range r.queues(ctx) {
		n, err := r.dq.Overdue(ctx, q, r.cfg.OverdueAfter)
		if err != nil {
			r.redisErr(errStats, "overdue "+q, err) //nolint:errcheck // counted and logged
			return
		}
		r.observe(ctx, relayobs.OverdueEvent{Queue: q, Tasks: n})
	}
}
