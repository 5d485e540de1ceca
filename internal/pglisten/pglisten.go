// Package pglisten holds the LISTEN loop the relay (its wake-ups) and the worker
// (its dead-hook sweep) share.
package pglisten

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Acquirer is where the listening connection comes from: a *pgxpool.Pool, or
// the relay's and the worker's DB.
type Acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Listen takes a connection out of pool (Hijack, so the pool's hooks apply to it
// as to every other: a BeforeConnect that fetches a rotated password, an
// AfterConnect that sets up the session), LISTENs on channel, calls up, then
// calls notified with each notification's payload until the connection fails or
// ctx ends, and returns that error. The connection is closed on return.
func Listen(ctx context.Context, pool Acquirer, channel string, up func(), notified func(payload string)) error {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	up()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		notified(n.Payload)
	}
}
