package bench

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/internal/sqlapi"
)

// enqueueTxSQL is enqueueTx through the SQL API's delayq_enqueue, on a pool whose
// sessions set delayq.notify_channel to the session's own channel (as enqueueTx's
// client does), with the default cooldown: the side-by-side figure of issue 35.
func enqueueTxSQL(delay time.Duration) func(ctx context.Context, s *session, r *Result) error {
	return func(ctx context.Context, s *session, r *Result) error {
		pcfg := s.pool.Config()
		pcfg.ConnConfig.RuntimeParams["delayq.notify_channel"] = s.schema
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return err
		}
		defer pool.Close()
		r.Params["due_in"], r.Params["notify_cooldown"], r.Params["path"] = delay.String(), "25ms (delayq_notifiers, shared by the sessions)", "SQL API"
		sp := *s
		sp.pool = pool
		return withNotifications(ctx, s, r, func() error { return enqueueTxRun(ctx, &sp, r, sqlapi.New(s.schema).Enqueue, delay) })
	}
}

// enqueueBatchSQL is enqueueBatch through the SQL API's delayq_enqueue_many.
func enqueueBatchSQL(ctx context.Context, s *session, r *Result) error {
	r.Params["path"] = "SQL API"
	return enqueueBatchRun(ctx, s, r, sqlapi.New(s.schema).EnqueueMany)
}
