package relay

import (
	"context"
	"time"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/validate"
)

// deadTask is a task the reaper declared dead in Redis, to be mirrored into
// Postgres.
type deadTask struct{ queue, id string }

// reapLoop takes back expired leases every ReapInterval, queue by queue, and
// mirrors the tasks it declares dead into Postgres, so that reconcile never
// brings them back. Tasks whose mirroring failed are kept and tried again.
func (r *Relay) reapLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.ReapInterval)
	defer t.Stop()
	var unmirrored []deadTask
	for {
		unmirrored = r.reapOnce(ctx, unmirrored)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reapOnce visits every queue once (a full Reap is followed by the next at once)
// and returns the dead tasks not yet mirrored.
//
// A Reap call in hand is finished and its dead tasks mirrored even when ctx ends:
// a reply lost to a cancellation would leave them dead in Redis only.
func (r *Relay) reapOnce(ctx context.Context, unmirrored []deadTask) []deadTask {
	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.RoundTimeout)
	defer cancel()
	queues, err := r.queues(opCtx)
	if err != nil {
		r.pgErr(errReap, "list queues", err) //nolint:errcheck // counted and logged
	}
	for _, q := range queues {
		for ctx.Err() == nil {
			res, err := r.dq.Reap(opCtx, q, r.cfg.ReapBatch)
			if err != nil {
				r.redisErr(errReap, "reap "+q, err) //nolint:errcheck // counted and logged
				break
			}
			r.rd.ok()
			m := r.metrics.reaped
			m.WithLabelValues("requeued").Add(float64(len(res.Requeued)))
			m.WithLabelValues("dead").Add(float64(len(res.Dead)))
			m.WithLabelValues("orphan").Add(float64(len(res.Orphans)))
			for _, id := range res.Dead {
				unmirrored = append(unmirrored, deadTask{q, id})
			}
			if len(res.Requeued)+len(res.Dead)+len(res.Orphans) < r.cfg.ReapBatch {
				break
			}
		}
	}
	if len(unmirrored) > 0 {
		unmirrored = r.mirrorDead(opCtx, unmirrored)
	}
	return unmirrored
}

// mirrorDead writes dead tasks into Postgres: state dead, with the error and the
// attempts recorded in Redis, guarded by the version Redis holds, so a row that
// finished or was rescheduled meanwhile is left alone. A task that is no longer
// dead in Redis (requeued by a person, removed) is skipped. It returns the tasks
// it could not mirror.
func (r *Relay) mirrorDead(ctx context.Context, tasks []deadTask) []deadTask {
	byQueue := map[string][]string{}
	var order []string
	for _, t := range tasks {
		if _, ok := byQueue[t.queue]; !ok {
			order = append(order, t.queue)
		}
		byQueue[t.queue] = append(byQueue[t.queue], t.id)
	}
	var left []deadTask
	for _, q := range order {
		ids := byQueue[q]
		for len(ids) > 0 {
			part := ids[:min(len(ids), 1000)]
			if err := r.mirrorDeadQueue(ctx, q, part); err != nil {
				for _, id := range ids {
					left = append(left, deadTask{q, id})
				}
				break
			}
			ids = ids[len(part):]
		}
	}
	return left
}

func (r *Relay) mirrorDeadQueue(ctx context.Context, queue string, ids []string) error {
	infos, err := r.dq.Inspect(ctx, queue, ids...)
	if err != nil {
		return r.redisErr(errReap, "inspect dead "+queue, err)
	}
	var (
		qs, tids, errs     []string
		versions, attempts []int32
	)
	for _, ti := range infos {
		if ti.State != delayq.StateDead {
			continue
		}
		msg := ti.LastError
		if msg == "" {
			msg = delayq.LeaseExpiredError
		}
		qs, tids = append(qs, queue), append(tids, ti.ID)
		versions = append(versions, int32(ti.Version))
		attempts = append(attempts, int32(ti.Attempt))
		errs = append(errs, validate.ErrorSummary(msg))
	}
	if len(qs) == 0 {
		return nil
	}
	tag, err := r.pool.Exec(ctx, r.sql.MarkDead, qs, tids, versions, attempts, errs)
	if err != nil {
		return r.pgErr(errReap, "mirror dead tasks", err)
	}
	r.pg.ok()
	r.cfg.Logger.Info("relay: reaper declared tasks dead (lease expired, no attempts left)",
		"queue", queue, "tasks", len(qs), "rows_updated", tag.RowsAffected())
	return nil
}
