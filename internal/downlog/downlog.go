// Package downlog logs a store's outages once per change of state: a component
// (the relay, a worker) that cannot reach PostgreSQL or Redis says so in one
// WARN line when it first fails, and in one INFO line when it reaches the store
// again, however many rounds, retries and queues failed in between.
//
// Errors the server answered (a SQL error, a Redis error reply) are not
// outages: the store is up, and the caller logs them as it did, since they
// need a person (Report tells them apart).
package downlog

import (
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
)

// Grace is how soon after coming back a failure is taken as the same outage:
// right after a server returns, some pooled connections are still the dead
// ones of before. Such a relapse is logged only if it lasts longer than Grace.
const Grace = 2 * time.Second

// Tracker is one component's view of one store. Its methods are safe for
// concurrent use: a component's loops share it, so that the component logs one
// line per change of state, not one per loop.
type Tracker struct {
	log   *slog.Logger
	who   string // "relay", "worker"
	store string // "PostgreSQL", "Redis"

	down  atomic.Bool // fast path for OK
	mu    sync.Mutex
	quiet bool      // down, not logged yet (a relapse right after recovery)
	since time.Time // start of the outage
	upAt  time.Time // end of the last outage
}

// New returns the tracker of who's view of store, logging to log.
func New(log *slog.Logger, who, store string) *Tracker {
	return &Tracker{log: log, who: who, store: store}
}

// Fail records a failed attempt to reach the store: op is what was tried.
func (t *Tracker) Fail(op string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	switch {
	case !t.down.Load():
		t.down.Store(true)
		t.since = now
		t.quiet = !t.upAt.IsZero() && now.Sub(t.upAt) < Grace
		if t.quiet {
			return
		}
	case t.quiet && now.Sub(t.since) >= Grace:
		t.quiet = false
	default:
		return
	}
	t.log.Warn(t.who+": "+t.store+" unreachable; retrying with backoff", "op", op, "error", err.Error())
}

// OK records a call that reached the store.
func (t *Tracker) OK() {
	if !t.down.Load() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.down.Load() {
		return
	}
	t.down.Store(false)
	t.upAt = time.Now()
	if t.quiet {
		return
	}
	t.log.Info(t.who+": "+t.store+" reachable again", "down_for", time.Since(t.since).Round(time.Millisecond).String())
}

// Down reports whether the last call failed to reach the store.
func (t *Tracker) Down() bool { return t.down.Load() }

// Report records err of op: an outage (Outage) with Fail, and it returns
// true, the caller logging nothing more; an error the server answered with
// OK, and it returns false, the caller logging it as before.
func (t *Tracker) Report(op string, err error) bool {
	if Outage(err) {
		t.Fail(op, err)
		return true
	}
	t.OK()
	return false
}

// Outage reports whether err means that the store could not be reached (a
// refused or lost connection, a timeout, a server shutting down) rather than
// an answer of the server about a statement or command.
func Outage(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// FATAL errors (the server shutting down, too many connections) and the
		// connection-exception class are lost connections.
		c := pgErr.Code
		return pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC" ||
			strings.HasPrefix(c, "08") || strings.HasPrefix(c, "57P") || c == "53300"
	}
	if errors.Is(err, redis.Nil) {
		return false // a reply: no such key
	}
	var re redis.Error
	if errors.As(err, &re) {
		// go-redis reports some client-side conditions (a closed pool) as
		// redis.Error too; those messages start with "redis: ".
		return strings.HasPrefix(re.Error(), "redis: ")
	}
	return true
}
