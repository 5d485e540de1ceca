package relay

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// WithAfterEnqueue returns cfg with a hook that runs after the Redis write and
// before the commit of each round; an error it returns aborts the round.
func WithAfterEnqueue(cfg Config, f func() error) Config {
	cfg.afterEnqueue = f
	return cfg
}

// Prune runs the retention once.
func (r *Relay) Prune(ctx context.Context) (deleted int64, batches int, err error) {
	return r.prune(ctx)
}

// Round runs one relay round on a connection of its own.
func (r *Relay) Round(ctx context.Context) (int, error) {
	var conn *pgxpool.Conn
	defer func() {
		if conn != nil {
			conn.Release()
		}
	}()
	return r.round(ctx, &conn)
}

// RefreshStats refreshes the depth, lag and overdue gauges once.
func (r *Relay) RefreshStats(ctx context.Context) error { return r.refreshStats(ctx) }
