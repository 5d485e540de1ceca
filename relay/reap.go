package relay

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/delayq/delayq/internal/relayobs"
	"github.com/delayq/delayq/internal/transition"
)

// reapLoop takes back expired leases every ReapInterval, queue by queue, and
// settles the tasks out of attempts: dead in Postgres first, then in Redis.
func (r *Relay) reapLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.ReapInterval)
	defer t.Stop()
	for {
		r.reapOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reapOnce visits every queue once (a full Reap is followed by the next at once).
//
// A Reap call in hand is finished and its exhausted tasks settled even when ctx
// ends. Nothing is kept in memory between passes: an exhausted task that could not
// be settled (Postgres down, the relay killed) stays active in Redis with its lease
// revoked, and Reap reports it again after delayq.ExhaustedHold.
func (r *Relay) reapOnce(ctx context.Context) {
	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.RoundTimeout)
	defer cancel()
	for _, q := range r.queues(opCtx) {
		for ctx.Err() == nil {
			res, err := r.ops.Reap(opCtx, q, r.cfg.ReapBatch)
			if err != nil {
				r.redisErr(errReap, "reap "+q, err) //nolint:errcheck // counted and logged
				break
			}
			r.rd.OK()
			r.observe(ctx, relayobs.ReapEvent{Queue: q, Requeued: len(res.Requeued), Orphans: len(res.Orphans)})
			for part := range slices.Chunk(res.Exhausted, 1000) {
				r.settleExhausted(opCtx, q, part)
			}
			if len(res.Requeued)+len(res.Exhausted)+len(res.Orphans) < r.cfg.ReapBatch {
				break
			}
		}
	}
}

// settleExhausted settles tasks whose last lease expired with no attempt left:
// dead in Postgres first, then in Redis (transition.SettleExhausted).
func (r *Relay) settleExhausted(ctx context.Context, queue string, ids []string) {
	res, err := r.ops.SettleExhausted(ctx, r.pool, queue, ids)
	if res.Tasks > 0 {
		r.pg.OK() // MarkDead went through
	}
	if err != nil {
		// A task not settled is reported again after the hold.
		var se *transition.StepError
		if errors.As(err, &se) && se.Redis {
			r.redisErr(errReap, se.Step, se.Err) //nolint:errcheck // counted and logged
		} else if errors.As(err, &se) {
			r.pgErr(errReap, se.Step, se.Err) //nolint:errcheck // counted and logged
		}
		return
	}
	if res.Tasks == 0 {
		return
	}
	r.observe(ctx, relayobs.ReapEvent{Queue: queue, Dead: res.Killed, Finished: res.Removed})
	r.cfg.Logger.Info("relay: reaper settled tasks whose last lease expired",
		"queue", queue, "tasks", res.Tasks, "dead_rows", res.DeadRows, "dead", res.Killed, "removed_finished", res.Removed)
}
