package relay

import (
	"context"
	"slices"
	"time"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
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
			res, err := r.dq.Reap(opCtx, q, r.cfg.ReapBatch)
			if err != nil {
				r.redisErr(errReap, "reap "+q, err) //nolint:errcheck // counted and logged
				break
			}
			r.rd.ok()
			r.observe(ctx, ReapEvent{Queue: q, Requeued: len(res.Requeued), Orphans: len(res.Orphans)})
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
// Postgres first (dead, guarded by the version Redis holds, so a row that finished
// or was rescheduled meanwhile is left alone), then Redis follows what Postgres now
// says: dead there too, or removed when the row finished otherwise, is gone, or is
// at another version. Each Redis write is a compare-and-set on the task as probed.
func (r *Relay) settleExhausted(ctx context.Context, queue string, ids []string) {
	infos, err := r.dq.Inspect(ctx, queue, ids...)
	if err != nil {
		r.redisErr(errReap, "inspect exhausted "+queue, err) //nolint:errcheck // reported again after the hold
		return
	}
	var (
		qs, tids, errs     []string
		versions, attempts []int32
	)
	for _, ti := range infos {
		if ti.State != delayq.StateActive {
			continue // changed since the reap: not ours to settle
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
	if len(tids) == 0 {
		return
	}
	tag, err := r.pool.Exec(ctx, r.sql.MarkDead, qs, tids, versions, attempts, errs)
	if err != nil {
		r.pgErr(errReap, "mark exhausted tasks dead", err) //nolint:errcheck // reported again after the hold
		return
	}
	r.pg.ok()
	rows, err := r.store.Rows(ctx, r.pool, queue, tids)
	if err != nil {
		r.pgErr(errReap, "read exhausted tasks", err) //nolint:errcheck // reported again after the hold
		return
	}
	_, probes, err := r.dq.Probe(ctx, queue, tids...)
	if err != nil {
		r.redisErr(errReap, "probe exhausted "+queue, err) //nolint:errcheck // reported again after the hold
		return
	}
	var repairs []delayq.Repair
	killed, removed := 0, 0
	for i, p := range probes {
		if p.State != delayq.StateActive || p.Version != int(versions[i]) {
			continue
		}
		row := rows[p.ID]
		switch {
		case row.Exists && row.State == taskstate.Dead && row.Version == p.Version:
			repairs = append(repairs, delayq.Repair{Op: delayq.RepairKill, ID: p.ID, Fingerprint: p.Fingerprint, Error: row.LastError})
			killed++
		case row.Exists && row.State.Live() && row.Version == p.Version:
			// MarkDead did not see it (changed in between): the next reap decides.
		default:
			// Done, cancelled, purged, or another version: nothing of this copy
			// may run or stay.
			repairs = append(repairs, delayq.Repair{Op: delayq.RepairRemove, ID: p.ID, Fingerprint: p.Fingerprint})
			removed++
		}
	}
	if len(repairs) > 0 {
		if _, err := r.dq.RepairIf(ctx, queue, repairs...); err != nil {
			r.redisErr(errReap, "settle exhausted "+queue, err) //nolint:errcheck // reported again after the hold
			return
		}
	}
	r.observe(ctx, ReapEvent{Queue: queue, Dead: killed, Finished: removed})
	r.cfg.Logger.Info("relay: reaper settled tasks whose last lease expired",
		"queue", queue, "tasks", len(tids), "dead_rows", tag.RowsAffected(), "dead", killed, "removed_finished", removed)
}
