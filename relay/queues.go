package relay

import (
	"context"

	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/internal/reconcile"
)

// controlLoop mirrors the queue controls every queuectl.SyncInterval.
func (r *Relay) controlLoop(ctx context.Context) {
	for {
		if err := r.syncControls(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("relay: mirror queue controls", "error", err.Error())
		}
		if !sleep(ctx, queuectl.SyncInterval) {
			return
		}
	}
}

// syncControls writes every queue's controls from Postgres into Redis.
func (r *Relay) syncControls(ctx context.Context) error {
	_, err := reconcile.RestoreControls(ctx, r.pool, r.dq, reconcile.Options{Schema: r.cfg.Schema})
	return err
}
