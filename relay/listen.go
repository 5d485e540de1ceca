package relay

import (
	"context"
	"slices"

	"github.com/delayq/delayq/internal/pglisten"
)

// listenLoop holds a connection of its own (taken out of the pool) that LISTENs on
// the notify channel, and wakes the relay loop for every notification. Producers
// notify in their transaction, so Postgres delivers it at commit, never for a
// rollback. After (re)connecting it wakes the relay once, since notifications sent
// while it was away are lost; the poll interval covers that time.
func (r *Relay) listenLoop(ctx context.Context) {
	bo := newBackoff(r.cfg.BackoffMin, r.cfg.BackoffMax)
	up := func() {
		bo.reset()
		r.pg.OK()
		r.notify()
	}
	for ctx.Err() == nil {
		err := r.listen(ctx, up)
		if ctx.Err() != nil {
			return
		}
		// A lost connection is logged once per outage, with the relay's own
		// Postgres errors; the poll interval covers the time without it.
		r.pgErr(errListen, "listen", err) //nolint:errcheck // counted and logged
		if !sleep(ctx, bo.next()) {
			return
		}
	}
}

// listen connects, LISTENs, calls up, and forwards the notifications of the
// relay's queues until the connection fails or ctx ends (pglisten.Listen).
func (r *Relay) listen(ctx context.Context, up func()) error {
	return pglisten.Listen(ctx, r.pool, r.cfg.NotifyChannel, up, func(queue string) {
		if len(r.cfg.Queues) == 0 || slices.Contains(r.cfg.Queues, queue) {
			r.notify()
		}
	})
}

// notify wakes the relay loop (a flag: several notifications make one wake-up).
func (r *Relay) notify() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}
