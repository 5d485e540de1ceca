package outbox

import (
	"context"
	"fmt"
)

// statements are the SQL of a Client, with its table and channel spliced in (both are
// validated plain identifiers).
type statements struct {
	enqueue, enqueueMany, cancel, reschedule, state, markDone, markDoneMany, recordFailure string
}

func newStatements(table string, cfg Config) statements {
	// notify is a scalar subquery the outer SELECT evaluates (once) when it emits its
	// first row, that is only if a row was inserted or updated. NOTIFY is transactional:
	// the relay hears it when the caller's transaction commits, and never if it rolls
	// back. Postgres folds identical notifications of one transaction into one.
	//
	// Only rows due within cfg.NotifyWithin notify (soon is the condition on run_at):
	// Postgres serializes the commits of notifying transactions.
	notify := func(queueExpr, from string) string {
		return fmt.Sprintf(`(SELECT count(*) FROM (SELECT pg_notify('%s', %s) FROM %s) AS n)`,
			cfg.NotifyChannel, queueExpr, from)
	}
	soon := "true"
	if cfg.NotifyWithin > 0 {
		soon = fmt.Sprintf("run_at < statement_timestamp() + interval '%d microseconds'", cfg.NotifyWithin.Microseconds())
	}
	clear := "payload"
	if cfg.ClearPayloadOnDone {
		clear = "''::bytea"
	}
	return statements{
		// $1 queue, $2 task_id, $3 run_at or NULL, $4 delay in µs, $5 payload, $6 max_attempts.
		// A duplicate inserts nothing, returns no row and raises no error, so the caller's
		// transaction goes on.
		enqueue: fmt.Sprintf(`WITH ins AS (
	INSERT INTO %s (queue, task_id, run_at, payload, max_attempts)
	VALUES ($1, $2, COALESCE($3::timestamptz, statement_timestamp() + $4::bigint * interval '1 microsecond'), $5, $6)
	ON CONFLICT (queue, task_id) DO NOTHING
	RETURNING run_at
)
SELECT run_at, %s FROM ins`, table, notify("$1::text", "(SELECT 1 FROM ins WHERE "+soon+") AS v")),

		// Arrays, one element per task, duplicates within the batch already removed:
		// $1 queue, $2 task_id, $3 run_at (NULL: use the delay), $4 delay (an
		// interval of microseconds: added exactly, so the caller can tell the run_at
		// from statement_timestamp()), $5 payload, $6 max_attempts.
		//
		// Rows are inserted in key order, so that two batches with common keys wait
		// for each other instead of deadlocking: the caller sends the arrays sorted
		// by (queue, task_id), bytewise, and the rows reach the INSERT in array
		// order. The arrays are unnested in the select list (ProjectSet: one row per
		// element, in step, streamed), and nothing between it and the INSERT can
		// reorder rows (TestEnqueueManyPlan checks the plan). An ORDER BY would say
		// the same in SQL but costs a sort node that copies every row, although it
		// finds them sorted; unnest(...) in FROM would copy every array into a
		// tuplestore first.
		//
		// The first row is the summary: the number inserted, statement_timestamp()
		// (the base of every delay) and the notification count. Only when fewer were
		// inserted than sent (duplicates of existing rows) one more row per inserted
		// task follows, marked n = -1, naming it; otherwise the scan of ins is never
		// run (a one-time filter).
		enqueueMany: fmt.Sprintf(`WITH ins AS (
	INSERT INTO %s (queue, task_id, run_at, payload, max_attempts)
	SELECT u.queue, u.task_id, COALESCE(u.run_at, statement_timestamp() + u.delay), u.payload, u.max_attempts
	FROM (SELECT unnest($1::text[]) AS queue, unnest($2::text[]) AS task_id,
	             unnest($3::timestamptz[]) AS run_at, unnest($4::interval[]) AS delay,
	             unnest($5::bytea[]) AS payload, unnest($6::int[]) AS max_attempts) AS u
	ON CONFLICT (queue, task_id) DO NOTHING
	RETURNING queue, task_id, run_at
), c AS (
	SELECT count(*) AS n FROM ins
)
SELECT c.n, statement_timestamp(), %s, ''::text, ''::text FROM c
UNION ALL
SELECT -1, statement_timestamp(), 0, queue, task_id FROM ins
WHERE (SELECT n FROM c) < cardinality($2::text[])`, table, notify("d.queue", "(SELECT DISTINCT queue FROM ins WHERE "+soon+") AS d")),

		// $1 queue, $2 task_id.
		cancel: fmt.Sprintf(`UPDATE %s
SET state = 'cancelled', done_at = statement_timestamp(), payload = %s
WHERE queue = $1 AND task_id = $2 AND state IN ('pending', 'queued')`, table, clear),

		// $1 queue, $2 task_id, $3 run_at. Back to pending with a new version: the relay
		// puts it in Redis again, replacing the older version there, and a worker holding
		// the older version cannot complete it.
		reschedule: fmt.Sprintf(`WITH upd AS (
	UPDATE %s
	SET run_at = $3, state = 'pending', version = version + 1, queued_at = NULL
	WHERE queue = $1 AND task_id = $2 AND state IN ('pending', 'queued')
	RETURNING version, run_at
)
SELECT version, %s FROM upd`, table, notify("$1::text", "(SELECT 1 FROM upd WHERE "+soon+") AS v")),

		// $1 queue, $2 task_id. Explains why a guarded update found nothing.
		state: fmt.Sprintf(`SELECT state FROM %s WHERE queue = $1 AND task_id = $2`, table),

		// $1 queue, $2 task_id, $3 version.
		markDone: fmt.Sprintf(`UPDATE %s
SET state = 'done', done_at = statement_timestamp(), payload = %s
WHERE queue = $1 AND task_id = $2 AND version = $3 AND state IN ('pending', 'queued')`, table, clear),

		// Arrays $1 queue, $2 task_id, $3 version: the guard of markDone for many
		// tasks in one statement. The rows are locked in key order first, so that
		// two overlapping batches wait for each other instead of deadlocking.
		markDoneMany: fmt.Sprintf(`WITH locked AS (
	SELECT t.queue, t.task_id
	FROM %[1]s t
	JOIN unnest($1::text[], $2::text[], $3::int[]) AS k(queue, task_id, version)
	  ON t.queue = k.queue AND t.task_id = k.task_id AND t.version = k.version
	WHERE t.state IN ('pending', 'queued')
	ORDER BY t.queue COLLATE "C", t.task_id COLLATE "C"
	FOR UPDATE OF t
)
UPDATE %[1]s t
SET state = 'done', done_at = statement_timestamp(), payload = %[2]s
FROM locked l
WHERE t.queue = l.queue AND t.task_id = l.task_id
RETURNING t.queue, t.task_id`, table, clear),

		// $1 queue, $2 task_id, $3 version, $4 attempt, $5 last_error, $6 dead.
		recordFailure: fmt.Sprintf(`UPDATE %s
SET attempt = $4, last_error = $5,
    state = CASE WHEN $6::boolean THEN 'dead' ELSE state END,
    done_at = CASE WHEN $6::boolean THEN statement_timestamp() ELSE done_at END
WHERE queue = $1 AND task_id = $2 AND version = $3 AND state IN ('pending', 'queued')`, table),
	}
}

// runner runs the statements on either side: pgx or database/sql.
type runner interface {
	// query runs sql and calls each for every row, with the row's Scan.
	query(ctx context.Context, sql string, args []any, each func(scan func(dest ...any) error) error) error
	// exec runs sql and returns the number of rows it affected.
	exec(ctx context.Context, sql string, args []any) (int64, error)
}

type pgxRunner struct{ q Querier }

func (r pgxRunner) query(ctx context.Context, sql string, args []any, each func(func(...any) error) error) error {
	rows, err := r.q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (r pgxRunner) exec(ctx context.Context, sql string, args []any) (int64, error) {
	tag, err := r.q.Exec(ctx, sql, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

type sqlRunner struct{ q SQLQuerier }

func (r sqlRunner) query(ctx context.Context, sql string, args []any, each func(func(...any) error) error) error {
	rows, err := r.q.QueryContext(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows.Scan); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return rows.Close()
}

func (r sqlRunner) exec(ctx context.Context, sql string, args []any) (int64, error) {
	res, err := r.q.ExecContext(ctx, sql, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
