package relay

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/delayq/delayq/internal/relayobs"
)

// pgErr counts and reports an error of Postgres. Errors the server sent (SQL
// errors) are logged each time, since they need a person; the others mean the
// server cannot be reached and are logged once per outage.
// kind is the label of delayq_relay_errors_total.
func (r *Relay) pgErr(kind, op string, err error) error {
	r.observe(context.Background(), relayobs.ErrorEvent{Kind: kind, Op: op, Err: err})
	if errors.Is(err, errHook) || !r.pg.Report(op, err) {
		r.pg.OK()
		r.cfg.Logger.Error("relay: PostgreSQL error", "op", op, "error", err.Error())
	}
	return err
}

// redisErr counts and reports an error of Redis, as pgErr does.
func (r *Relay) redisErr(kind, op string, err error) error {
	r.observe(context.Background(), relayobs.ErrorEvent{Kind: kind, Op: op, Err: err})
	if errors.Is(err, errHook) || !r.rd.Report(op, err) {
		r.rd.OK()
		r.cfg.Logger.Error("relay: Redis error", "op", op, "error", err.Error())
	}
	return err
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
	if fromPg(err) {
		return r.pgErr(kind, op, err)
	}
	return r.redisErr(kind, op, err)
}

func fromPg(err error) bool {
	var pgErr *pgconn.PgError
	var connErr *pgconn.ConnectError
	return errors.As(err, &pgErr) || errors.As(err, &connErr) || pgconn.SafeToRetry(err)
}

// warnStore logs err of a step that talks to both servers and is not counted
// as a round's error (mirroring the queue controls, self-healing): an outage
// once per change of state, with the rounds' (pg or rd), else msg as a WARN.
func (r *Relay) warnStore(msg string, err error) {
	t := r.rd
	if fromPg(err) {
		t = r.pg
	}
	if !t.Report(strings.TrimPrefix(msg, "relay: "), err) {
		r.cfg.Logger.Warn(msg, "error", err.Error())
	}
}
