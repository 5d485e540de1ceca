package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// finishedEvery: the finished states are counted every this many stats refreshes.
const finishedEvery = 10

// statsLoop refreshes the depth and lag gauges every StatsInterval.
func (r *Relay) statsLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.StatsInterval)
	defer t.Stop()
	for i := 0; ; i++ {
		if err := r.refreshStats(ctx, i%finishedEvery == 0); err != nil && ctx.Err() == nil {
			r.pgErr(errStats, "stats", err) //nolint:errcheck // counted and logged
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refreshStats reads the outbox depth: pending and queued from their partial
// indexes; with finished, also the done, dead and cancelled rows, under a
// statement timeout since it reads all of them.
func (r *Relay) refreshStats(ctx context.Context, finished bool) error {
	if _, err := r.untilNext(ctx); err != nil {
		return err
	}
	var pending, queued int64
	if err := r.pool.QueryRow(ctx, r.sql.DepthLive).Scan(&pending, &queued); err != nil {
		return err
	}
	r.metrics.depth.WithLabelValues("pending").Set(float64(pending))
	r.metrics.depth.WithLabelValues("queued").Set(float64(queued))
	r.refreshOverdue(ctx)
	if !finished {
		return nil
	}
	counts := map[string]int64{"done": 0, "dead": 0, "cancelled": 0}
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL statement_timeout = '10s'"); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, r.sql.DepthFinished)
		if err != nil {
			return err
		}
		var (
			state string
			n     int64
		)
		_, err = pgx.ForEachRow(rows, []any{&state, &n}, func() error {
			counts[state] = n
			return nil
		})
		return err
	})
	if err != nil {
		return err
	}
	for state, n := range counts {
		r.metrics.depth.WithLabelValues(state).Set(float64(n))
	}
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
		r.metrics.overdue.WithLabelValues(q).Set(float64(n))
	}
}
