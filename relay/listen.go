package relay

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
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
		r.pg.ok()
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

// listen connects, LISTENs, calls up, and forwards notifications until the
// connection fails or ctx ends. The connection comes from the pool and is taken
// out of it (Hijack), so the pool's hooks apply to it as to every other: a
// BeforeConnect that fetches a rotated password, an AfterConnect that sets up the
// session.
func (r *Relay) listen(ctx context.Context, up func()) error {
	pc, err := r.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{r.cfg.NotifyChannel}.Sanitize()); err != nil {
		return err
	}
	up()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if len(r.cfg.Queues) == 0 || slices.Contains(r.cfg.Queues, n.Payload) {
			r.notify()
		}
	}
}

// notify wakes the relay loop (a flag: several notifications make one wake-up).
func (r *Relay) notify() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}
