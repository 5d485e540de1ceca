package relay

import (
	"context"

	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/internal/reconcile"
)

// controlLoop mirrors the queue controls every queuectl.SyncInterval.
func (r *Relay) controlLoop(ctx context.Context) {
	for {
		switch err := r.syncControls(ctx); {
		case err == nil:
			r.pg.OK()
			// With no controls, the sync asked Redis nothing; the rounds may ask
			// it nothing either while no task is due: a ping says it is back.
			if r.rd.Down() && r.dq.AsRedis().Ping(ctx).Err() == nil {
				r.rd.OK()
			}
		case ctx.Err() == nil:
			r.warnStore("relay: mirror queue controls", err)
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
