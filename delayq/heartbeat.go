package delayq

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
)

// heartbeats renews the leases of every run in flight: one loop per worker, and per
// beat one ExtendMany call per queue for all the leases that need it, instead of a
// timer and a script call per run. Most runs end before they need a renewal; for
// them a heartbeat is an entry added to and removed from a map.
//
// The loop ticks every HeartbeatInterval/2 and renews each lease whose last renewal
// (or claim) is older than HeartbeatInterval/2, so a lease is renewed between half
// an interval and an interval after the previous renewal, as a timer per run
// renewed it after an interval. A lease that Redis refuses cancels that run's
// handler with ErrLeaseLost; a call that fails is tried again at the next tick
// until the lease would have run out, then the runs of that call are cancelled
// the same way.
type heartbeats struct {
	w     *worker
	every time.Duration

	mu   sync.Mutex
	runs map[*run]*beat // the runs whose lease is renewed; removed by off
}

// beat is a run's renewal state, guarded by heartbeats.mu.
type beat struct {
	last     time.Time // when the last renewal was sent (the claim's start at first)
	deadline time.Time // the lease runs out then, as far as the worker knows
}

func newHeartbeats(w *worker) *heartbeats {
	return &heartbeats{w: w, every: w.cfg.HeartbeatInterval, runs: make(map[*run]*beat)}
}

// on starts renewing r's lease (claimed at now). Nothing when heartbeats are off.
func (h *heartbeats) on(r *run, now time.Time) {
	if h == nil || h.every <= 0 {
		return
	}
	h.mu.Lock()
	h.runs[r] = &beat{last: now, deadline: now.Add(h.w.cfg.Lease)}
	h.mu.Unlock()
	r.beating.Store(true)
}

// off stops renewing r's lease (idempotent). A renewal in flight may still reach
// Redis, where it changes nothing once the lease is settled (extend.lua checks
// the token and the status); its answer is ignored.
func (h *heartbeats) off(r *run) {
	if h == nil || !r.beating.CompareAndSwap(true, false) {
		return
	}
	h.mu.Lock()
	delete(h.runs, r)
	h.mu.Unlock()
}

// loop beats until ctx is done; run it while runs may be in flight.
func (h *heartbeats) loop(ctx context.Context) {
	if h.every <= 0 {
		return
	}
	tick := time.NewTicker(h.every / 2)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			h.beat(ctx)
		}
	}
}

// beat renews the leases that need it, one call per queue.
func (h *heartbeats) beat(ctx context.Context) {
	now := time.Now()
	due := make(map[string][]*run)
	h.mu.Lock()
	for r, b := range h.runs {
		if now.Sub(b.last) > h.every/2 {
			due[r.t.Queue] = append(due[r.t.Queue], r)
		}
	}
	h.mu.Unlock()
	if len(due) == 0 {
		return
	}
	queues := make([]string, 0, len(due))
	for q := range due {
		queues = append(queues, q)
	}
	sort.Strings(queues)
	for _, q := range queues {
		h.renew(ctx, q, due[q])
	}
}

// renew renews the leases of runs, all of queue, with one ExtendMany call.
func (h *heartbeats) renew(ctx context.Context, queue string, runs []*run) {
	w := h.w
	leases := make([]dispatch.Lease, len(runs))
	for i, r := range runs {
		leases[i] = dispatch.Lease{ID: r.t.ID, Token: r.ct.Token}
	}
	sent := time.Now()
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(w.cfg.OpTimeout, h.every))
	renewed, err := w.dq.ExtendMany(ectx, queue, leases, w.cfg.Lease)
	cancel()

	var lost []*run
	failed, expired := 0, 0
	h.mu.Lock()
	now := time.Now()
	for i, r := range runs {
		b, ok := h.runs[r]
		if !ok { // ended meanwhile: the answer no longer matters
			continue
		}
		switch {
		case err == nil && renewed[i]:
			b.last, b.deadline = sent, sent.Add(w.cfg.Lease)
			continue
		case err == nil: // refused: another token holds the task, or it is gone
		case now.Before(b.deadline):
			failed++ // tried again at the next tick
			continue
		default:
			expired++
		}
		delete(h.runs, r)
		r.beating.Store(false)
		lost = append(lost, r)
	}
	h.mu.Unlock()
	switch {
	case err == nil:
		w.rd.OK()
	case failed > 0:
		// Tried again at the next tick: an outage is logged once.
		w.storeFailed(w.rd, "heartbeat", err, "queue", queue, "leases", failed)
	}
	if expired > 0 {
		w.log.Warn("worker: heartbeat failed until the lease ran out", "queue", queue, "leases", expired, "err", err)
	}
	for _, r := range lost {
		r.markLost()
		r.stop(ErrLeaseLost)
	}
}
