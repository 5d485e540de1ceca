package relay

import (
	"context"
	"time"

	"github.com/delayq/delayq/internal/relayobs"
)

// retentionLoop prunes finished rows every RetentionInterval, the first time at
// once.
func (r *Relay) retentionLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.RetentionInterval)
	defer t.Stop()
	for {
		if _, _, err := r.prune(ctx); err != nil && ctx.Err() == nil {
			r.pgErr(errRetention, "retention", err) //nolint:errcheck // counted and logged
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// prune deletes done and cancelled rows that finished more than Retention ago, in
// batches of RetentionBatch rows, each its own short transaction, until a batch
// comes back short. Dead rows are kept: they wait for a person. It returns the
// rows deleted and the number of batches.
func (r *Relay) prune(ctx context.Context) (deleted int64, batches int, err error) {
	for ctx.Err() == nil {
		n, err := r.ops.Prune(ctx, r.pool, r.cfg.Retention, r.cfg.RetentionBatch)
		if err != nil {
			return deleted, batches, err
		}
		batches++
		deleted += n
		r.observe(ctx, relayobs.RetentionEvent{Deleted: n})
		if n < int64(r.cfg.RetentionBatch) {
			break
		}
	}
	if deleted > 0 {
		r.cfg.Logger.Info("relay: retention deleted finished rows", "rows", deleted, "batches", batches,
			"older_than", r.cfg.Retention.String())
	}
	return deleted, batches, ctx.Err()
}
