package relay

import "context"

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

// Round runs one relay round.
func (r *Relay) Round(ctx context.Context) (int, error) { return r.round(ctx) }

// RefreshStats refreshes the depth, lag and overdue gauges once.
func (r *Relay) RefreshStats(ctx context.Context) error { return r.refreshStats(ctx) }
