package relay

import (
	"context"
	"time"

	"github.com/delayq/delayq/internal/reconcile"
)

// ControlSyncInterval is how often the relay writes the queue controls (pause,
// rate limit, shard count) from Postgres into Redis's copy. The control
// operations (package control, the CLI, the dashboard) write both stores
// themselves; this sync is their repair: it restores a Redis write that failed
// (control.ErrNotMirrored), or a Redis that lost its data. Each write is keyed by
// the controls' version, so it never undoes a newer change.
const ControlSyncInterval = 2 * time.Second

// controlLoop mirrors the queue controls every ControlSyncInterval.
func (r *Relay) controlLoop(ctx context.Context) {
	for {
		if err := r.syncControls(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("relay: mirror queue controls", "error", err.Error())
		}
		if !sleep(ctx, ControlSyncInterval) {
			return
		}
	}
}

// syncControls writes every queue's controls from Postgres into Redis.
func (r *Relay) syncControls(ctx context.Context) error {
	_, err := reconcile.RestoreControls(ctx, r.pool, r.dq, reconcile.Options{Schema: r.cfg.Schema})
	return err
}
