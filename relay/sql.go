package relay

import "fmt"

// statements are the relay's SQL with the outbox table (a validated, quoted name)
// spliced in.
type statements struct {
	takeDue, takeDueQueues   string
	markInvalid              string
	nextDue, nextDueQueues   string
	markDead                 string
	queues                   string
	depthLive, depthFinished string
	prune                    string
}

func newStatements(table string) statements {
	// takeDue takes the batch of a round and marks it queued, in one statement:
	// $1 horizon in µs, $2 limit. The index delayq_outbox_pending_run_at_idx
	// serves the inner SELECT in run_at order; rows locked by another relay are
	// skipped, so relays side by side share the work. The rows it locked are
	// updated by ctid (a TID scan) and returned. They are queued only if the
	// round commits, after its Redis write; a round that fails rolls back, and
	// the rows are pending again. (A row updated by someone else between the
	// statement's snapshot and its lock is not returned, and waits for the next
	// round.)
	const takeDue = `UPDATE %[1]s
SET state = 'queued', queued_at = now()
WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM %[1]s
	WHERE state = 'pending' AND run_at < now() + $1::bigint * interval '1 microsecond'%[2]s
	ORDER BY run_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
))
RETURNING ctid, queue, task_id, run_at, payload, attempt, max_attempts, version`
	// nextDue tells when the next pending row falls due (NULL: none), on the
	// database clock, and that clock.
	const nextDue = `SELECT min(run_at), now() FROM %s WHERE state = 'pending'%s`
	return statements{
		takeDue:       fmt.Sprintf(takeDue, table, ""),
		takeDueQueues: fmt.Sprintf(takeDue, table, " AND queue = ANY($3::text[])"),
		nextDue:       fmt.Sprintf(nextDue, table, ""),
		nextDueQueues: fmt.Sprintf(nextDue, table, " AND queue = ANY($1::text[])"),

		// $1 ctids, $2 errors: rows of the round Redis would refuse (a payload over
		// its limit), by the ctids takeDue returned; they wait for a person like any
		// dead task.
		markInvalid: fmt.Sprintf(`UPDATE %s
SET state = 'dead', last_error = ($2::text[])[array_position($1::tid[], ctid)], done_at = now()
WHERE ctid = ANY($1::tid[])`, table),

		// $1 queues, $2 task ids, $3 versions, $4 attempts, $5 errors: tasks the
		// reaper declared dead in Redis. The guard leaves finished rows and newer
		// versions (a reschedule) alone.
		markDead: fmt.Sprintf(`UPDATE %s AS o
SET state = 'dead', last_error = u.err, attempt = GREATEST(o.attempt, u.attempt), done_at = now()
FROM unnest($1::text[], $2::text[], $3::int[], $4::int[], $5::text[]) AS u(queue, task_id, version, attempt, err)
WHERE o.queue = u.queue AND o.task_id = u.task_id AND o.version = u.version
  AND o.state IN ('pending', 'queued')`, table),

		// The queues with queued rows, by a loose index scan of
		// delayq_outbox_queued_idx: one index probe per queue, however many rows.
		queues: fmt.Sprintf(`WITH RECURSIVE q(queue) AS (
	(SELECT queue FROM %[1]s WHERE state = 'queued' ORDER BY queue LIMIT 1)
	UNION ALL
	SELECT (SELECT o.queue FROM %[1]s AS o
	        WHERE o.state = 'queued' AND o.queue > q.queue ORDER BY o.queue LIMIT 1)
	FROM q WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL`, table),

		// Counts over the two partial indexes.
		depthLive: fmt.Sprintf(`SELECT (SELECT count(*) FROM %[1]s WHERE state = 'pending'),
       (SELECT count(*) FROM %[1]s WHERE state = 'queued')`, table),
		// Finished rows: all of them are read, so it runs less often, under a
		// statement timeout.
		depthFinished: fmt.Sprintf(`SELECT state, count(*) FROM %s WHERE done_at IS NOT NULL GROUP BY state`, table),

		// $1 retention in µs, $2 batch. One short statement (its own transaction)
		// per batch: the rows are found in done_at order on
		// delayq_outbox_done_at_idx, locked (rows locked by someone else are left for
		// the next batch), and deleted by ctid, a TID scan; the locks keep the ctids
		// valid until the delete.
		prune: fmt.Sprintf(`DELETE FROM %[1]s
WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM %[1]s
	WHERE done_at IS NOT NULL AND done_at < now() - $1::bigint * interval '1 microsecond'
	  AND state IN ('done', 'cancelled')
	ORDER BY done_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
))`, table),
	}
}
