package worker

import (
	"cmp"
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrTxOwned is returned by Commit and Rollback of the transaction a TxHandler
// gets: the worker ends it, committing the handler's writes together with the
// task's completion. Calling either fails the run (nothing the handler wrote is
// committed) and the task is retried. Return nil to commit, an error to roll back.
var ErrTxOwned = errors.New("worker: a TxHandler's transaction is committed or rolled back by the worker")

// handlerTx is the pgx.Tx a TxHandler gets. It saves a round trip per task: BEGIN
// is not sent on its own but in the same message as the handler's first Exec,
// Query, QueryRow or SendBatch; when the handler wrote nothing, it is not sent at
// all and the completion guard commits on its own. What needs the transaction
// begun first (COPY, savepoints, large objects, the connection itself) begins it
// through pgx.
//
// Whether the transaction has begun is read from the connection (the status of
// its last ReadyForQuery), so a BEGIN that failed on the wire leaves no state
// behind to correct.
type handlerTx struct {
	ctx  context.Context // the run's: for LargeObjects and Conn, which take none
	conn *pgx.Conn
	// tx is pgx's own transaction, made only for savepoints and large objects
	// (pgx's types for them need one). Its Commit and Rollback are never called.
	tx pgx.Tx
	// err is why the run must fail although the handler may return nil: it called
	// Commit or Rollback, or a BEGIN for Conn or LargeObjects failed.
	err error
}

var _ pgx.Tx = (*handlerTx)(nil)

func (t *handlerTx) begun() bool { return t.conn.PgConn().TxStatus() != 'I' }

// begin sends BEGIN on its own, for the methods that cannot carry it.
func (t *handlerTx) begin(ctx context.Context) error {
	if t.begun() {
		return nil
	}
	_, err := t.conn.Exec(ctx, "BEGIN")
	return err
}

// pgxTx returns pgx's transaction: a real BEGIN, or a savepoint when BEGIN has
// gone out with an earlier statement.
func (t *handlerTx) pgxTx(ctx context.Context) (pgx.Tx, error) {
	if t.tx == nil {
		opts := pgx.TxOptions{}
		if t.begun() {
			opts.BeginQuery = "SAVEPOINT delayq_handler"
		}
		tx, err := t.conn.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		t.tx = tx
	}
	return t.tx, nil
}

// batchable tells whether a statement's arguments can go in a pgx.Batch: a batch
// takes no per-statement execution mode or result formats.
func batchable(args []any) bool {
	for _, a := range args {
		switch a.(type) {
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			return false
		}
	}
	return len(args) > 0 // without arguments pgx uses the simple protocol
}

// withBegin sends BEGIN and the statement in one batch and reads BEGIN's result.
func (t *handlerTx) withBegin(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		return nil, cmp.Or(br.Close(), err)
	}
	return br, nil
}

func (t *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	switch {
	case t.begun():
	case len(args) == 0:
		// The simple protocol takes several statements in one message (and the
		// handler's may itself be several); the tag is the last one's.
		return t.conn.Exec(ctx, "BEGIN;\n"+sql)
	case batchable(args):
		br, err := t.withBegin(ctx, sql, args)
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		tag, err := br.Exec()
		return tag, cmp.Or(err, br.Close())
	default:
		if err := t.begin(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
	}
	return t.conn.Exec(ctx, sql, args...)
}

func (t *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if !t.begun() {
		if !batchable(args) {
			if err := t.begin(ctx); err != nil {
				return nil, err
			}
			return t.conn.Query(ctx, sql, args...)
		}
		br, err := t.withBegin(ctx, sql, args)
		if err != nil {
			return nil, err
		}
		rows, err := br.Query()
		if err != nil {
			return nil, cmp.Or(br.Close(), err)
		}
		return &batchRows{Rows: rows, br: br}, nil
	}
	return t.conn.Query(ctx, sql, args...)
}

func (t *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.begun() {
		return t.conn.QueryRow(ctx, sql, args...)
	}
	rows, err := t.Query(ctx, sql, args...)
	return &firstRow{rows: rows, err: err}
}

func (t *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.begun() {
		return t.conn.SendBatch(ctx, b)
	}
	withBegin := &pgx.Batch{}
	withBegin.Queue("BEGIN")
	withBegin.QueuedQueries = append(withBegin.QueuedQueries, b.QueuedQueries...)
	br := t.conn.SendBatch(ctx, withBegin)
	_, _ = br.Exec() // an error repeats on the caller's first result
	return br
}

func (t *handlerTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.begin(ctx); err != nil {
		return 0, err
	}
	return t.conn.CopyFrom(ctx, table, columns, src)
}

// Begin starts a savepoint (pgx's pseudo nested transaction), which the handler
// may commit or roll back.
func (t *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.pgxTx(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
}

func (t *handlerTx) LargeObjects() pgx.LargeObjects {
	tx, err := t.pgxTx(t.ctx)
	if err != nil {
		t.err = cmp.Or(t.err, err)
		return pgx.LargeObjects{} // unusable: the connection failed, and so does the run
	}
	return tx.LargeObjects()
}

// Prepare prepares on the connection: a prepared statement outlives transactions.
func (t *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Prepare(ctx, name, sql)
}

// Conn begins the transaction, so that what the handler runs on the connection is
// part of it.
func (t *handlerTx) Conn() *pgx.Conn {
	if err := t.begin(t.ctx); err != nil {
		t.err = cmp.Or(t.err, err)
	}
	return t.conn
}

func (t *handlerTx) Commit(context.Context) error {
	t.err = cmp.Or(t.err, ErrTxOwned)
	return ErrTxOwned
}

func (t *handlerTx) Rollback(context.Context) error {
	t.err = cmp.Or(t.err, ErrTxOwned)
	return ErrTxOwned
}

// end rolls back what the handler wrote, if anything.
func (t *handlerTx) end(ctx context.Context) {
	if t.begun() {
		_, _ = t.conn.Exec(ctx, "ROLLBACK") // a failed rollback closes the connection; the pool drops it
	}
}

// batchRows are the rows of a statement sent in a batch behind BEGIN: done with
// them, the batch is closed too, so that the connection is free again.
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error // closing the batch
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if !r.closed {
		r.closed = true
		r.Rows.Close()
		r.err = r.br.Close()
	}
}

func (r *batchRows) Err() error { return cmp.Or(r.Rows.Err(), r.err) }

// firstRow is QueryRow's row over Query's rows: the first row, or pgx.ErrNoRows.
type firstRow struct {
	rows pgx.Rows
	err  error
}

func (r *firstRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		return cmp.Or(r.rows.Err(), pgx.ErrNoRows)
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}
