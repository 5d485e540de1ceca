package delayq

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/delayq/delayq/internal/transition"
	"github.com/delayq/delayq/outbox"
)

// sqlTxHandler is a transactional handler on database/sql (sqlx, GORM, ent): it
// writes its effect through tx, a transaction the worker began on the *sql.DB
// given to HandleSQLTx, and the worker commits those writes together with the
// task's completion, as for a TxHandler. It must not commit or roll back tx: a
// run whose transaction the handler ended makes the task dead (ErrTxOwned), since
// its writes may have committed without the completion.
type sqlTxHandler func(ctx context.Context, tx *sql.Tx, t *Task) error

// HandleSQLTx registers a database/sql transactional handler for queue: its
// transactions are begun on db, which must reach the outbox's database (with the
// pgx driver, github.com/jackc/pgx/v5/stdlib, or any Postgres driver). See
// HandleTx.
func (w *worker) HandleSQLTx(queue string, db *sql.DB, h sqlTxHandler, cfg QueueConfig) error {
	if h == nil || db == nil {
		return fmt.Errorf("%w: nil handler or database for queue %q", ErrInvalidConfig, queue)
	}
	return w.register(queue, cfg, handlers{sql: h, sqlDB: db})
}

// RegisterSQL registers a database/sql transactional handler for the typed queue
// q (see Register and HandleSQLTx).
func RegisterSQL[T any](c *Client, db *sql.DB, q outbox.Queue[T], h func(ctx context.Context, tx *sql.Tx, t *Task, v T) error, cfg QueueConfig) error {
	if h == nil {
		return fmt.Errorf("%w: nil handler for queue %q", ErrInvalidConfig, q.Name)
	}
	if err := bindQueue(c, q); err != nil {
		return err
	}
	return c.w.HandleSQLTx(q.Name, db, func(ctx context.Context, tx *sql.Tx, t *Task) error {
		v, err := decode(q, t)
		if err != nil {
			return err
		}
		return h(ctx, tx, t, v)
	}, cfg)
}

// runSQL begins a database/sql handler's transaction and runs the handler in it.
// The transaction is nil when BEGIN failed.
func (r *run) runSQL(ctx context.Context) (*sql.Tx, error) {
	// The transaction outlives the handler's context, as the worker's own
	// bookkeeping does: database/sql rolls back a transaction whose context ends.
	tx, err := r.q.sqlDB.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	return tx, r.call(ctx, func(ctx context.Context) error { return r.q.sql(ctx, tx, r.t) })
}

// completeSQL runs the completion guard in the handler's transaction and commits:
// the handler's writes and the completion commit together or not at all. It
// returns an error when nothing may have been committed.
func (r *run) completeSQL(ctx context.Context, tx *sql.Tx) (outcome, error) {
	d, err := r.w.ops.CommitDoneSQL(ctx, tx, r.lease(), r.q.cfg.ClearPayload)
	switch {
	case errors.Is(err, transition.ErrTxEnded):
		return "", NoRetry(fmt.Errorf("%w: the handler ended its transaction; its writes may have committed without the completion", ErrTxOwned))
	case errors.Is(err, transition.ErrRefused):
		return r.refusedByState(ctx)
	case err != nil:
		return "", err
	}
	return r.handOff(d), nil
}
