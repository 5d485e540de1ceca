package relay

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/relayobs"
)

// health tracks whether a server is reachable, so that an outage is logged once
// when it starts and once when it ends, not at every attempt.
//
// Right after a server comes back, some pooled connections may still be the dead
// ones of before; a failure within healthGrace of recovering is taken as part of
// the same outage and logged only if it lasts longer than healthGrace.
type health struct {
	name string
	log  *slog.Logger

	mu    sync.Mutex
	down  bool
	quiet bool      // down, not logged yet (a relapse right after recovery)
	since time.Time // start of the outage
	upAt  time.Time // end of the last outage
}

const healthGrace = 2 * time.Second

func newHealth(name string, log *slog.Logger) *health {
	return &health{name: name, log: log}
}

// fail records a failed attempt to reach the server.
func (h *health) fail(op string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	switch {
	case !h.down:
		h.down, h.since = true, now
		h.quiet = !h.upAt.IsZero() && now.Sub(h.upAt) < healthGrace
		if h.quiet {
			return
		}
	case h.quiet && now.Sub(h.since) >= healthGrace:
		h.quiet = false
	default:
		return
	}
	h.log.Warn("relay: "+h.name+" unreachable; retrying with backoff", "op", op, "error", err.Error())
}

// ok records a successful call.
func (h *health) ok() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.down {
		return
	}
	h.down, h.upAt = false, time.Now()
	if h.quiet {
		return
	}
	h.log.Info("relay: "+h.name+" reachable again", "down_for", time.Since(h.since).Round(time.Millisecond).String())
}

// pgErr counts and reports an error of Postgres. Errors the server sent (SQL
// errors) are logged each time, since they need a person; the others mean the
// server cannot be reached and are logged once per outage.
// kind is the label of delayq_relay_errors_total.
func (r *Relay) pgErr(kind, op string, err error) error {
	r.observe(context.Background(), relayobs.ErrorEvent{Kind: kind, Op: op, Err: err})
	if isPgReply(err) {
		r.pg.ok()
		r.cfg.Logger.Error("relay: PostgreSQL error", "op", op, "error", err.Error())
	} else {
		r.pg.fail(op, err)
	}
	return err
}

// isPgReply reports whether err is an error the server sent about a statement (it
// is up and answered), rather than a lost or refused connection. FATAL errors
// (the server shutting down, too many connections) and the connection-exception
// class count as lost connections.
func isPgReply(err error) bool {
	if errors.Is(err, errHook) {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch {
	case pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC":
		return false
	case len(pgErr.Code) == 5 && (pgErr.Code[:2] == "08" || pgErr.Code[:3] == "57P" || pgErr.Code == "53300"):
		return false
	}
	return true
}

// redisErr counts and reports an error of Redis, as pgErr does.
func (r *Relay) redisErr(kind, op string, err error) error {
	r.observe(context.Background(), relayobs.ErrorEvent{Kind: kind, Op: op, Err: err})
	if isRedisReply(err) {
		r.rd.ok()
		r.cfg.Logger.Error("relay: Redis error", "op", op, "error", err.Error())
	} else {
		r.rd.fail(op, err)
	}
	return err
}

// isRedisReply reports whether err is an error reply of the server (it is up),
// or an unexpected reply shape, rather than a network error.
func isRedisReply(err error) bool {
	var re redis.Error
	if errors.As(err, &re) {
		// go-redis reports some client-side conditions (a closed pool) as
		// redis.Error too; those messages start with "redis: ".
		return len(re.Error()) < 7 || re.Error()[:7] != "redis: "
	}
	return false
}

// errHook marks an error injected by a test hook: a server error, not an outage.
var errHook = errors.New("relay: injected failure")

// backoff is a jittered exponential backoff: the n-th delay is drawn from
// [d/2, d] with d = min(max, min * 2^n) ("equal jitter").
type backoff struct {
	min, max time.Duration
	n        int
}

func newBackoff(min, max time.Duration) *backoff { return &backoff{min: min, max: max} }

func (b *backoff) next() time.Duration {
	d := b.max
	if b.n < 30 {
		d = min(b.max, b.min<<b.n)
	}
	b.n++
	half := d / 2
	return half + rand.N(d-half+1)
}

func (b *backoff) reset() { b.n = 0 }

// sleep waits d or until ctx ends; it reports whether ctx is still alive.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// storeErr counts and reports an error of a step that talks to both servers:
// Postgres's when it came from Postgres, else Redis's.
func (r *Relay) storeErr(kind, op string, err error) error {
	var pgErr *pgconn.PgError
	var connErr *pgconn.ConnectError
	if errors.As(err, &pgErr) || errors.As(err, &connErr) || pgconn.SafeToRetry(err) {
		return r.pgErr(kind, op, err)
	}
	return r.redisErr(kind, op, err)
}
