package reconcile

import "fmt"

// statements are the package's SQL with the outbox table (a validated, quoted name)
// spliced in.
type statements struct {
	queues, count, page, exists, lookup, lock string
	stateCounts, stateCountsQueues            string
	pendingLag, pendingLagQueues              string
	listDead, retryDead, purgeDead            string
}

// rowColumns are the columns read into a row.
const rowColumns = `task_id, state, version, attempt, max_attempts, run_at, payload`

func newStatements(table string) statements {
	return statements{
		// Every queue of the outbox by a loose index scan of the primary key: one
		// index probe per queue, however many rows.
		queues: fmt.Sprintf(`WITH RECURSIVE q(queue) AS (
	(SELECT queue FROM %[1]s ORDER BY queue LIMIT 1)
	UNION ALL
	SELECT (SELECT o.queue FROM %[1]s AS o WHERE o.queue > q.queue ORDER BY o.queue LIMIT 1)
	FROM q WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL`, table),

		// $1 queue.
		count: fmt.Sprintf(`SELECT count(*) FROM %s WHERE queue = $1`, table),

		// $1 queue, $2 the last task id of the previous page ('' first), $3 limit.
		// Keyset pagination on the primary key: each page is an index range scan.
		page: fmt.Sprintf(`SELECT task_id, state, version FROM %s
WHERE queue = $1 AND task_id > $2
ORDER BY task_id
LIMIT $3`, table),

		// $1 queue, $2 task ids: which of them have a row.
		exists: fmt.Sprintf(`SELECT task_id FROM %s WHERE queue = $1 AND task_id = ANY($2::text[])`, table),

		// $1 queue, $2 task ids.
		lookup: fmt.Sprintf(`SELECT %s FROM %s WHERE queue = $1 AND task_id = ANY($2::text[])`, rowColumns, table),

		// $1 queue, $2 task ids. Locks the rows for a repair, in key order; rows
		// another transaction holds (a worker completing, a relay, a cancel) are
		// skipped rather than waited for.
		lock: fmt.Sprintf(`SELECT %s FROM %s WHERE queue = $1 AND task_id = ANY($2::text[])
ORDER BY task_id
FOR UPDATE SKIP LOCKED`, rowColumns, table),

		stateCounts:       fmt.Sprintf(`SELECT queue, state, count(*) FROM %s GROUP BY queue, state`, table),
		stateCountsQueues: fmt.Sprintf(`SELECT queue, state, count(*) FROM %s WHERE queue = ANY($1::text[]) GROUP BY queue, state`, table),

		// How long the oldest due pending row has waited for the relay, in seconds,
		// on the database clock; over the partial index of pending rows.
		pendingLag: fmt.Sprintf(`SELECT queue, extract(epoch FROM now() - min(run_at))::float8
FROM %s WHERE state = 'pending' AND run_at <= now() GROUP BY queue`, table),
		pendingLagQueues: fmt.Sprintf(`SELECT queue, extract(epoch FROM now() - min(run_at))::float8
FROM %s WHERE state = 'pending' AND run_at <= now() AND queue = ANY($1::text[]) GROUP BY queue`, table),

		// $1 queues (empty: all), $2 limit. Newest deaths first.
		listDead: fmt.Sprintf(`SELECT queue, task_id, attempt, max_attempts, coalesce(last_error, ''), done_at, version
FROM %s
WHERE state = 'dead' AND (cardinality($1::text[]) = 0 OR queue = ANY($1::text[]))
ORDER BY done_at DESC NULLS LAST, queue, task_id
LIMIT $2`, table),

		// $1 queues (empty: all), $2 task ids (empty: all), $3 limit. Back to queued,
		// run now, attempts reset, in the transaction that also rewrites Redis.
		retryDead: fmt.Sprintf(`UPDATE %[1]s AS o
SET state = 'queued', attempt = 0, done_at = NULL, run_at = statement_timestamp(), queued_at = statement_timestamp()
FROM (
	SELECT queue, task_id FROM %[1]s
	WHERE state = 'dead'
	  AND (cardinality($1::text[]) = 0 OR queue = ANY($1::text[]))
	  AND (cardinality($2::text[]) = 0 OR task_id = ANY($2::text[]))
	ORDER BY queue, task_id
	LIMIT $3
	FOR UPDATE SKIP LOCKED
) AS d
WHERE o.queue = d.queue AND o.task_id = d.task_id
RETURNING o.queue, o.task_id, o.version, o.max_attempts, o.payload, o.run_at`, table),

		// $1 queues (empty: all), $2 task ids (empty: all), $3 limit.
		purgeDead: fmt.Sprintf(`DELETE FROM %[1]s AS o
USING (
	SELECT queue, task_id FROM %[1]s
	WHERE state = 'dead'
	  AND (cardinality($1::text[]) = 0 OR queue = ANY($1::text[]))
	  AND (cardinality($2::text[]) = 0 OR task_id = ANY($2::text[]))
	ORDER BY queue, task_id
	LIMIT $3
	FOR UPDATE SKIP LOCKED
) AS d
WHERE o.queue = d.queue AND o.task_id = d.task_id
RETURNING o.queue, o.task_id`, table),
	}
}
