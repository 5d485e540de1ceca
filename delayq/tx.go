package delayq

import (
	"cmp"
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// ErrTxOwned is returned by Commit and Rollback of the transaction a TxHandler
// gets: the worker ends it, committing the handler's writes together with the
// task's completion. Calling either fails the run (nothing the handler wrote is
// committed) and the task is retried. Return nil to commit, an error to roll back.
var ErrTxOwned = errors.New("worker: a TxHandler's transaction is committed or rolled back by the worker")

// handlerTx is the pgx.Tx a TxHandler gets. It behaves as a pgx.Tx begun by
// pool.Begin, and saves a round trip per task: BEGIN is not sent on its own but in
// the same message as the handler's first Exec, Query, QueryRow or SendBatch; when
// the handler wrote nothing, it is not sent at all and the completion guard commits
// on its own.
//
// Where carrying BEGIN would change what the handler sees, the transaction is begun
// on its own first: for Prepare (a failed Prepare aborts a transaction, and behind
// PgBouncer's transaction pooling a statement must be prepared on the server
// connection of the transaction), CopyFrom, a prepared statement's name (pgx looks
// names up before SQL; "BEGIN;\n"+name is no SQL), savepoints, large objects and the
// connection itself. A statement that fails before its BEGIN ran (nothing of the
// message ran: it does not parse, or pgx failed to prepare it, or to encode an
// argument) is sent again, alone, in the begun transaction: there its error aborts
// the transaction, as in a real one, and is what the handler gets. One difference
// remains: in the extended protocol's cache_statement, cache_describe and
// describe_exec modes, pgx closes the connection when it cannot encode an argument
// of a batch's query queued behind another (here, BEGIN). The handler gets the
// same error, but its transaction is lost rather than left intact, and the run
// fails.
//
// Whether the transaction has begun is read from the connection (the status of
// its last ReadyForQuery), so a BEGIN that failed on the wire leaves no state
// behind to correct.
//
// In a group commit (sp set), what travels with the first statement is the run's
// savepoint instead, behind the group's BEGIN when no earlier run of the group
// wrote: a run that writes nothing sends nothing. Whether the savepoint is open is
// kept in spOpen, from the results of the message that carried it.
type handlerTx struct {
	ctx  context.Context // the run's: for LargeObjects and Conn, which take none
	conn *pgx.Conn
	// sp is the run's savepoint in a group commit; "" for a transaction of its own.
	sp     string
	spOpen bool
	// shift is how many characters the statements sent ahead of the handler's
	// first put ahead of its SQL in a simple-protocol batch.
	shift int
	// tx is pgx's own transaction, made only for savepoints and large objects
	// (pgx's types for them need one). Its Commit and Rollback are never called.
	tx pgx.Tx
	// err is why the run must fail although the handler may return nil: it called
	// Commit or Rollback, or a BEGIN for Conn or LargeObjects failed.
	err error
	// mode is the connection's default query execution mode, read when needed.
	mode pgx.QueryExecMode
	// shifted are the server errors whose Position unshift corrected already
	// (pgx returns one error from several calls).
	shifted map[*pgconn.PgError]bool
}

var _ pgx.Tx = (*handlerTx)(nil)

// begun tells whether the run's transaction (in a group, its savepoint) is open.
func (t *handlerTx) begun() bool {
	if t.sp != "" {
		return t.spOpen
	}
	return t.conn.PgConn().TxStatus() != 'I'
}

var beginOnly = []string{"BEGIN"}

// prefix is what opens the run's transaction, to go ahead of its first statement:
// BEGIN; in a group, the run's savepoint, behind BEGIN when the group's
// transaction has not begun.
func (t *handlerTx) prefix() []string {
	switch {
	case t.sp == "":
		return beginOnly
	case t.conn.PgConn().TxStatus() == 'I':
		return []string{"BEGIN", "SAVEPOINT " + t.sp}
	}
	return []string{"SAVEPOINT " + t.sp}
}

// prefixSQL is the prefix as one simple-protocol query.
func (t *handlerTx) prefixSQL() string { return strings.Join(t.prefix(), ";\n") }

// queuePrefix queues the prefix on b. pgx joins a simple-protocol batch's
// statements with "\n;", so the prefix puts t.shift characters ahead of the
// handler's SQL.
func (t *handlerTx) queuePrefix(b *pgx.Batch) int {
	p := t.prefix()
	t.shift = 0
	for _, s := range p {
		b.Queue(s)
		t.shift += len(s) + len("\n;")
	}
	return len(p)
}

// opened records that the prefix ran.
func (t *handlerTx) opened() { t.spOpen = t.sp != "" }

// begin begins the transaction on its own, for what cannot carry BEGIN.
func (t *handlerTx) begin(ctx context.Context) error {
	if t.begun() {
		return nil
	}
	if t.sp != "" {
		if _, err := t.conn.Exec(ctx, t.prefixSQL()); err != nil {
			return err
		}
		t.opened()
		return nil
	}
	tx, err := t.conn.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return err
	}
	t.tx = tx
	return nil
}

// resend tells whether a statement sent with BEGIN that failed with err must be
// sent again in a transaction begun on its own: BEGIN did not run, so nothing did,
// and the connection is still open.
func (t *handlerTx) resend(err error) bool {
	return err != nil && !t.begun() && !t.conn.IsClosed()
}

// pgxTx returns pgx's transaction: a real BEGIN (in a group, the run's
// savepoint), or a savepoint when the transaction has begun with an earlier
// statement.
func (t *handlerTx) pgxTx(ctx context.Context) (pgx.Tx, error) {
	if t.tx == nil {
		opts := pgx.TxOptions{}
		opening := !t.begun() && t.sp != ""
		switch {
		case opening:
			opts.BeginQuery = t.prefixSQL()
		case t.begun():
			opts.BeginQuery = "SAVEPOINT delayq_handler"
		}
		tx, err := t.conn.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		if opening {
			t.opened()
		}
		t.tx = tx
	}
	return t.tx, nil
}

// simpleProtocol tells whether the connection sends a batch as one query.
func (t *handlerTx) simpleProtocol() bool {
	if t.mode == 0 {
		t.mode = t.conn.Config().DefaultQueryExecMode
	}
	return t.mode == pgx.QueryExecModeSimpleProtocol
}

// unshift corrects the Position of a server error in a statement that went to
// Postgres behind n characters of BEGIN in one query string, so that it points
// into the handler's SQL. inBatch says BEGIN was queued in a batch: one query
// string in the simple protocol only.
func (t *handlerTx) unshift(err error, n int, inBatch bool) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Position <= int32(n) || t.shifted[pe] {
		return err
	}
	if inBatch && !t.simpleProtocol() {
		return err
	}
	if t.shifted == nil {
		t.shifted = map[*pgconn.PgError]bool{}
	}
	t.shifted[pe] = true
	pe.Position -= int32(n)
	return err
}

// named tells whether sql may name a prepared statement: it is one word (SQL of
// one word has no business in a handler, and runs all the same). A name with
// spaces is sent with BEGIN, fails as SQL and is sent again.
func named(sql string) bool { return !strings.ContainsAny(sql, " \t\r\n\f") }

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

// withBegin sends the prefix and the statement in one batch and reads the
// prefix's results.
func (t *handlerTx) withBegin(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	n := t.queuePrefix(b)
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, b)
	for range n {
		if _, err := br.Exec(); err != nil {
			return nil, cmp.Or(br.Close(), err)
		}
	}
	t.opened()
	return br, nil
}

func (t *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if !t.begun() && !named(sql) && (len(args) == 0 || batchable(args)) {
		if tag, err := t.execWithBegin(ctx, sql, args); !t.resend(err) {
			return tag, err
		}
	}
	if err := t.begin(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.conn.Exec(ctx, sql, args...)
}

func (t *handlerTx) execWithBegin(ctx context.Context, sql string, args []any) (pgconn.CommandTag, error) {
	if len(args) == 0 {
		// The simple protocol takes several statements in one message (and the
		// handler's may itself be several); the tag is the last one's. Nothing of
		// it ran when it does not parse; else the prefix ran first, and a failure
		// after it aborted the transaction.
		pre := t.prefixSQL() + ";\n"
		tag, err := t.conn.Exec(ctx, pre+sql)
		if err == nil || t.conn.PgConn().TxStatus() == 'E' {
			t.opened()
		}
		return tag, t.unshift(err, len(pre), false)
	}
	br, err := t.withBegin(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	return tag, t.unshift(cmp.Or(err, br.Close()), t.shift, true)
}

func (t *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if !t.begun() && !named(sql) && batchable(args) {
		if rows, sent, err := t.queryWithBegin(ctx, sql, args); sent {
			return rows, err
		}
	}
	if err := t.begin(ctx); err != nil {
		return failedRows(err), err
	}
	return t.conn.Query(ctx, sql, args...)
}

// queryWithBegin sends BEGIN and the query in one batch. sent is false when the
// query must be sent again (resend).
func (t *handlerTx) queryWithBegin(ctx context.Context, sql string, args []any) (rows pgx.Rows, sent bool, err error) {
	br, err := t.withBegin(ctx, sql, args)
	if err != nil {
		return failedRows(err), !t.resend(err), err
	}
	r, err := br.Query()
	rows = &batchRows{Rows: r, t: t, br: br}
	if err != nil {
		rows.Close()
		if !t.simpleProtocol() {
			// pgx's Query in the extended protocol reports what fails once the
			// query is sent through the rows, not as its error.
			return rows, true, nil
		}
		return rows, true, t.unshift(err, t.shift, true)
	}
	return rows, true, nil
}

func (t *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.begun() {
		return t.conn.QueryRow(ctx, sql, args...)
	}
	rows, _ := t.Query(ctx, sql, args...)
	return &firstRow{rows: rows}
}

// errBatchNotSent stops the callbacks of a batch that is sent again.
var errBatchNotSent = errors.New("worker: batch sent again")

func (t *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if pgx.FailedBatchResults(b, nil).Tx() != nil { // b.BeginTx was called; as pgx.Tx's SendBatch:
		return pgx.FailedBatchResults(b, errors.New("Batch.BeginTx cannot be used within a transaction"))
	}
	if t.begun() || len(b.QueuedQueries) == 0 {
		return t.conn.SendBatch(ctx, b)
	}
	// The prefix goes ahead of copies of the caller's queries: pgx fills in a
	// query when it sends it, and b may have to be sent again. A callback runs
	// only for the batch the caller gets, with the results it gets.
	var sb *sentBatch
	withBegin := &pgx.Batch{}
	n := t.queuePrefix(withBegin)
	for _, q := range b.QueuedQueries {
		c := &pgx.QueuedQuery{SQL: q.SQL, Arguments: q.Arguments}
		if fn := q.Fn; fn != nil {
			c.Fn = func(pgx.BatchResults) error {
				if sb == nil {
					return errBatchNotSent
				}
				return fn(sb)
			}
		}
		withBegin.QueuedQueries = append(withBegin.QueuedQueries, c)
	}
	br := t.conn.SendBatch(ctx, withBegin)
	for range n {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			if !t.resend(err) {
				return pgx.FailedBatchResults(b, err)
			}
			if err := t.begin(ctx); err != nil {
				return pgx.FailedBatchResults(b, err)
			}
			return t.conn.SendBatch(ctx, b)
		}
	}
	t.opened()
	sb = &sentBatch{BatchResults: br, t: t}
	return sb
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
	if err != nil && t.begun() {
		// The transaction is aborted. An empty query makes pgx's transaction
		// without changing anything: its large objects fail as in a real one.
		if tx, err = t.conn.BeginTx(t.ctx, pgx.TxOptions{BeginQuery: " "}); err == nil {
			t.tx = tx
		}
	}
	if err != nil {
		t.err = cmp.Or(t.err, err) // the connection failed, and so does the run
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		tx = pgx.FailedBatchResults(b, err).Tx() // closed: its large objects return pgx.ErrTxClosed
	}
	return tx.LargeObjects()
}

// Prepare begins the transaction first (see handlerTx).
func (t *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.conn.Prepare(ctx, name, sql)
}

// Conn begins the transaction, so that what the handler runs on the connection is
// part of it. The handler must not end the transaction through it (a COMMIT or
// ROLLBACK sent as SQL): the run fails, and in a group commit so do the runs
// before it, whose writes such a COMMIT would commit ahead of their completions.
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

// sentBatch is the results of a caller's batch sent behind BEGIN.
type sentBatch struct {
	pgx.BatchResults
	t *handlerTx
}

func (b *sentBatch) Exec() (pgconn.CommandTag, error) {
	tag, err := b.BatchResults.Exec()
	return tag, b.t.unshift(err, b.t.shift, true)
}

func (b *sentBatch) Query() (pgx.Rows, error) {
	rows, err := b.BatchResults.Query()
	return &batchRows{Rows: rows, t: b.t}, b.t.unshift(err, b.t.shift, true)
}

func (b *sentBatch) QueryRow() pgx.Row {
	rows, _ := b.Query()
	return &firstRow{rows: rows}
}

func (b *sentBatch) Close() error { return b.t.unshift(b.BatchResults.Close(), b.t.shift, true) }

// batchRows are the rows of a statement in a batch behind BEGIN. Rows of the
// handler's own statement (br set) close the batch when they are closed, also by
// a failed Scan as pgx's rows are, so that the connection is free again.
type batchRows struct {
	pgx.Rows
	t      *handlerTx
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

func (r *batchRows) Scan(dest ...any) error {
	err := r.Rows.Scan(dest...)
	if err != nil {
		r.Close()
	}
	return err
}

func (r *batchRows) Values() ([]any, error) {
	v, err := r.Rows.Values()
	if err != nil {
		r.Close()
	}
	return v, err
}

func (r *batchRows) Close() {
	if !r.closed {
		r.closed = true
		r.Rows.Close()
		if r.br != nil {
			r.err = r.br.Close()
		}
	}
}

func (r *batchRows) Err() error { return r.t.unshift(cmp.Or(r.Rows.Err(), r.err), r.t.shift, true) }

// failedRows are pgx's rows of a query that failed before it was sent.
func failedRows(err error) pgx.Rows {
	rows, _ := pgx.FailedBatchResults(&pgx.Batch{}, err).Query()
	return rows
}

// firstRow is QueryRow's row over Query's rows, as pgx's: the first row, or
// pgx.ErrNoRows; the rows are closed when it has been scanned.
type firstRow struct{ rows pgx.Rows }

func (r *firstRow) Scan(dest ...any) error {
	defer r.rows.Close()
	if err := r.rows.Err(); err != nil {
		return err
	}
	for _, d := range dest {
		if _, ok := d.(*pgtype.DriverBytes); ok {
			return errors.New("cannot scan into *pgtype.DriverBytes from QueryRow")
		}
	}
	if !r.rows.Next() {
		return cmp.Or(r.rows.Err(), pgx.ErrNoRows)
	}
	_ = r.rows.Scan(dest...) // a failure is the rows' error too
	r.rows.Close()
	return r.rows.Err()
}
