package taskstate

import (
	"fmt"
	"time"

	"github.com/delayq/delayq/internal/validate"
)

// Config names the outbox table and the options its statements depend on. The
// public packages validate these before they get here.
type Config struct {
	// Schema holds the outbox table (a validated plain identifier).
	Schema string
	// NotifyChannel is the channel enqueues, reschedules and dead retries notify.
	NotifyChannel string
	// NotifyWithin: only tasks due that soon notify at commit (-1: all). Postgres
	// serializes the commits of notifying transactions.
	NotifyWithin time.Duration
	// ClearPayloadOnDone empties the payload of done and cancelled rows.
	ClearPayloadOnDone bool
}

// TableName is the outbox table, created by package migrations.
const TableName = "delayq_outbox"

// DefaultSchema is the schema of the outbox table when a Config leaves it empty.
const DefaultSchema = "public"

// DefaultNotifyChannel is the channel the enqueue notifies and the relay
// listens on when a Config leaves it empty.
const DefaultNotifyChannel = "delayq_outbox"

// Table returns the quoted, schema-qualified table name.
func (c Config) Table() string { return fmt.Sprintf(`"%s"."%s"`, c.Schema, TableName) }

// DepsTableName holds the dependencies still unfinished of waiting tasks (package
// workflow), created by migration 00021.
const DepsTableName = "delayq_deps"

// depsTable returns the quoted, schema-qualified dependencies table.
func (c Config) depsTable() string { return fmt.Sprintf(`"%s"."%s"`, c.Schema, DepsTableName) }

// HookChannel is the channel the deaths recorded without their OnDead hook
// (reap-dead, relay-invalid) notify at commit, with the queue as payload: the
// workers that serve the queue with a hook LISTEN on it and sweep. It is
// NotifyChannel with "_dead" appended, cut to Postgres's 63 bytes: two channels
// that share their first 58 bytes share it, which costs a sweep that finds nothing.
func (c Config) HookChannel() string {
	const suffix = "_dead"
	ch := c.NotifyChannel
	if len(ch) > 63-len(suffix) {
		ch = ch[:63-len(suffix)]
	}
	return ch + suffix
}

// Statements is every SQL statement on the outbox table, with the table and the
// channel spliced in. Each field's comment gives its parameters; the transition a
// statement makes is in Transitions.
type Statements struct {
	// Producer: Enqueue and EnqueueMany insert (enqueue), Cancel and Reschedule
	// change live rows.
	Enqueue, EnqueueStartBy, EnqueueMany, Cancel, Reschedule string
	// EnqueueWaiting inserts a task waiting on others (enqueue-waiting).
	EnqueueWaiting string
	// EnqueueReplace inserts a task with a conflict policy, or replaces or
	// debounces the task of its key (enqueue-replace); ConflictRow reads that
	// row when the policy did not apply.
	EnqueueReplace, ConflictRow string
	// SetResult stores a run's result in its handler's transaction
	// (set-result); ReadResult reads a task's state and result.
	SetResult, ReadResult string
	// Batches (migration 00024, batch.go): EnqueueBatch inserts a callback
	// and its children (enqueue-batch), ReleaseBatch the callback of a batch
	// none of whose children was inserted; BatchRow reads a batch's counter;
	// CancelBatch and CancelTasks cancel a workflow (workflow-cancel).
	EnqueueBatch, ReleaseBatch, BatchRow, BatchOf, CancelBatch, CancelTasks string

	// Row reads one row's state, version and last error: why a guarded update
	// found nothing. Rows does the same for many ids of one queue.
	Row, Rows string

	// Worker: the completion guard in its four forms, the failure record, a
	// snoozed run's next run time, and a run's cancellation.
	Guard, GuardAbort, GuardMany, GuardGroup, RecordFailure, Snooze, CancelRun string
	// NoteLost: a run that failed after its lease was lost, in the attempt
	// history alone (no transition).
	NoteLost string
	// MissDeadline: a claim came after the task's start deadline (miss-deadline).
	MissDeadline string
	// A death recorded without its OnDead hook (dead-hook): TakeDeadHook takes
	// the next marked row whose hook is due and clears its mark, DelayDeadHook
	// marks it again for later (a hook that failed), NextDeadHook tells when the
	// next mark falls due.
	TakeDeadHook, DelayDeadHook, NextDeadHook string

	// Relay: the round (TakeDue), poison rows (MarkInvalid), the next due time,
	// the queues with queued rows, the reaper's dead mirror, the row gauges, and
	// retention.
	TakeDue, TakeDueQueues string
	// ShardedQueues is every queue of more than one shard with its count, from
	// delayq_queues (a row a queue with controls): the round sends it behind
	// TakeDue in the same transaction and routes the rows it took by it.
	ShardedQueues                string
	MarkInvalid                  string
	NextDue, NextDueQueues       string
	QueuedQueues                 string
	MarkDead                     string
	DepthLive, DepthFinished     string
	Prune                        string
	StateCounts, StateCountsSome string
	PendingLag, PendingLagSome   string
	// LiveCounts, LiveCountsSome and FinishedEstimate: the counts of delayq
	// stats at a cost independent of the table's size (StateCounts is the
	// exact count of every row).
	LiveCounts, LiveCountsSome string
	FinishedEstimate           string
	// DueByMinute and DueByMinuteSome: the live rows of each queue by the
	// minute they fall due in, for the autoscaling forecast (DueCounts).
	DueByMinute, DueByMinuteSome string

	// Reconcile, check and the dead-letter tools.
	AllQueues, CountQueue, Page, PageQueued, Exists, Lookup, Lock string
	ListDead, RetryDead, PurgeDead                                string

	// Operator: a dead task retried with an edited payload (the dashboard).
	RetryDeadEdited string

	// Tests (package delayqtest): the rows of a queue, or of one id.
	Find string
	// Benchmarks: NotifyLateOff disables migration 00015's trigger (the late
	// commit's notification) on the table, for a run of the behaviour before it.
	NotifyLateOff string
}

// logAppend is the attempt history of a row (the column col) with one entry
// appended, made of entry: attempt, version, outcome, error, stack (NULL: none),
// stamped with the statement's time; then trimmed to its newest entries, at most
// validate.MaxAttemptLog of them and validate.MaxAttemptLogBytes of JSON in all
// (the newest is kept whatever its size: its texts are cut by the caller). Only
// the statements that record a run that did not succeed use it: a success writes
// no history (the row's done state is its entry).
func logAppend(col, entry string) string {
	return fmt.Sprintf(`(SELECT jsonb_agg(l.e ORDER BY l.i) FROM (
	SELECT a.e, a.i, row_number() OVER w AS r, sum(octet_length(a.e::text)) OVER w AS b
	FROM (SELECT %[2]s) AS n(attempt, version, outcome, error, stack),
	     jsonb_array_elements(coalesce(%[1]s, '[]'::jsonb) || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
		'attempt', n.attempt, 'version', n.version, 'at', statement_timestamp(), 'outcome', n.outcome,
		'error', n.error, 'stack', n.stack)))) WITH ORDINALITY AS a(e, i)
	WINDOW w AS (ORDER BY a.i DESC)
) AS l WHERE l.r <= %[3]d AND (l.r = 1 OR l.b <= %[4]d))`, col, entry, validate.MaxAttemptLog, validate.MaxAttemptLogBytes)
}

// RowColumns are the columns Lookup and Lock return, in order, and TakeDue after
// the ctid and the queue: ScanRow and ScanTaken read them.
const RowColumns = `task_id, state, version, attempt, max_attempts, run_at, payload, trace_context, start_by, priority, concurrency_key`

// NewStatements builds the statements for cfg.
func NewStatements(cfg Config) Statements {
	table := cfg.Table()
	// notify is a scalar subquery the outer SELECT evaluates (once) when it emits its
	// first row, that is only if a row was inserted or updated. NOTIFY is transactional:
	// the relay hears it when the caller's transaction commits, and never if it rolls
	// back. Postgres folds identical notifications of one transaction into one.
	notifyOn := func(channel, queueExpr, from string) string {
		return fmt.Sprintf(`(SELECT count(*) FROM (SELECT pg_notify('%s', %s) FROM %s) AS n)`,
			channel, queueExpr, from)
	}
	notify := func(queueExpr, from string) string { return notifyOn(cfg.NotifyChannel, queueExpr, from) }
	// notifyHook wakes the workers that sweep the queues of the rows upd marked
	// (HookChannel), once per queue, at commit.
	notifyHook := notifyOn(cfg.HookChannel(), "d.queue", "(SELECT DISTINCT queue FROM upd) AS d")
	// Only rows due within cfg.NotifyWithin notify (soon is the condition on run_at).
	soon := "true"
	if cfg.NotifyWithin > 0 {
		soon = fmt.Sprintf("run_at < statement_timestamp() + interval '%d microseconds'", cfg.NotifyWithin.Microseconds())
	}
	clear := "payload"
	if cfg.ClearPayloadOnDone {
		clear = "''::bytea"
	}
	// takeDue takes the batch of a round and marks it queued, in one statement:
	// $1 horizon in µs, $2 limit. The index delayq_outbox_pending_run_at_idx
	// serves the first inner SELECT in run_at order; the second takes the rows
	// whose older version is in Redis (a queued task rescheduled: it has a
	// queued_at), whatever their run_at, on delayq_outbox_revoke_idx, so the
	// older version is replaced before it falls due. Rows locked by another relay
	// are skipped, so relays side by side share the work. The rows it locked are
	// updated by ctid (a TID scan) and returned. They are queued only if the round
	// commits, after its Redis write; a round that fails rolls back, and the rows
	// are pending again. (A row updated by someone else between the statement's
	// snapshot and its lock is not returned, and waits for the next round.) The
	// move drops notify_late (migration 00015): its trigger fired at the insert's
	// commit, and a queued row need not carry the channel's bytes for its life.
	// The round reads the shard counts (ShardedQueues) right after, in the same
	// transaction and round trip, and routes by the count Postgres holds, never by
	// one Redis may have lost. A count changes only while its queue has no pending
	// row (SetShards refuses otherwise), and the rows this statement took stay
	// pending to every other transaction until the round commits: so the count
	// read after it is the count they must be moved with. (Read a row at a time,
	// by a subquery or a join here, it cost the relay 13 % of its rows a second:
	// BENCHMARKS.md, issue 29.)
	const takeDue = `UPDATE %[1]s
SET state = 'queued', queued_at = now(), notify_late = NULL
WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM %[1]s
	WHERE state = 'pending' AND run_at < now() + $1::bigint * interval '1 microsecond'%[2]s
	ORDER BY run_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
) || ARRAY(
	SELECT ctid FROM %[1]s
	WHERE state = 'pending' AND queued_at IS NOT NULL AND run_at >= now() + $1::bigint * interval '1 microsecond'%[2]s
	ORDER BY run_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
))
RETURNING ctid, queue, ` + RowColumns
	// nextDue tells when the next pending row falls due (NULL: none), on the
	// database clock, and that clock.
	const nextDue = `SELECT min(run_at), now() FROM %s WHERE state = 'pending'%s`
	// guard is the completion guard: $1 queue, $2 task_id, $3 version, $4 clear
	// the payload.
	guard := fmt.Sprintf(`UPDATE %s
	SET state = 'done', done_at = statement_timestamp(),
	    payload = CASE WHEN $4::boolean OR %t THEN ''::bytea ELSE payload END
	WHERE queue = $1 AND task_id = $2 AND version = $3 AND state IN ('pending', 'queued')`, table, cfg.ClearPayloadOnDone)
	// Every dead row of the selection, $1 queues (empty: all), $2 task ids (empty:
	// all), $3 limit, locked in key order.
	const deadRows = `SELECT queue, task_id FROM %[1]s
	WHERE state = 'dead'
	  AND (cardinality($1::text[]) = 0 OR queue = ANY($1::text[]))
	  AND (cardinality($2::text[]) = 0 OR task_id = ANY($2::text[]))
	ORDER BY queue, task_id
	LIMIT $3
	FOR UPDATE SKIP LOCKED`
	const liveCounts = `SELECT queue, 'pending', count(*) FROM %[1]s WHERE state = 'pending'%[2]s GROUP BY queue
UNION ALL
SELECT queue, 'queued', count(*) FROM %[1]s WHERE state = 'queued'%[2]s GROUP BY queue
UNION ALL
SELECT queue, 'dead', count(*) FROM %[1]s WHERE state = 'dead'%[2]s GROUP BY queue
UNION ALL
SELECT queue, 'waiting', count(*) FROM %[1]s WHERE state = 'waiting'%[2]s GROUP BY queue`
	// dueByMinute counts the live rows of each queue due before $1 + $2 minutes
	// ($1 timestamptz, $2 minutes), by minute since $1: pending rows over
	// delayq_outbox_pending_run_at_idx (a range of it, index-only: it carries the
	// queue), overdue ones as minute -1 (the relay's lag); queued rows due from $1 on
	// over delayq_outbox_queued_idx, which holds no run_at, so every queued row of
	// the queues is read in the heap (those overdue are Redis's backlog, counted
	// there). %[2]s: a filter on the queues. The minute is computed in float8
	// (date_part), exact for differences within the hour to the microsecond, and
	// 25-40 % faster than extract's numeric on 90,000 rows (BENCHMARKS.md).
	const dueByMinute = `SELECT queue, minute, count(*) FROM (
	SELECT queue, CASE WHEN run_at < $1::timestamptz THEN -1
	                   ELSE floor(date_part('epoch', run_at - $1::timestamptz) / 60)::int END AS minute
	FROM %[1]s WHERE state = 'pending' AND run_at < $1::timestamptz + $2::int * interval '1 minute'%[2]s
	UNION ALL
	SELECT queue, floor(date_part('epoch', run_at - $1::timestamptz) / 60)::int
	FROM %[1]s WHERE state = 'queued' AND run_at >= $1::timestamptz
	  AND run_at < $1::timestamptz + $2::int * interval '1 minute'%[2]s
) AS d GROUP BY queue, minute`
	s := Statements{
		// $1 queue, $2 task_id, $3 run_at or NULL, $4 delay in µs, $5 payload, $6 max_attempts,
		// $7 trace_context or NULL, $8 start_by or NULL, $9 priority (0..9), $10 and $11
		// the task_id and created_at of an enqueue into the same queue that notified
		// moments ago, or NULL, $12 concurrency_key or NULL.
		// A duplicate inserts nothing, returns no row and raises no error, so the caller's
		// transaction goes on. Returns run_at, the notification count and created_at.
		//
		// A start deadline before the due time (run_at, or now when run_at is past)
		// inserts nothing either: the one row returned is that due time, -1 and NULL;
		// unless the key exists, a duplicate (a producer's retry after its deadline
		// passed finds its task there).
		// The check is here because the due time of a delay is statement_timestamp()
		// plus the delay, on the database clock: exact only in the statement, and
		// the caller's transaction stays usable (no error is raised).
		//
		// The notification is left out when that enqueue's row is visible to this
		// statement: its transaction committed (and the savepoint it ran in, if any,
		// was not rolled back), so its notification was delivered and the relay's
		// follow-up rounds move this task too (outbox Config.NotifyCooldown). In
		// progress, rolled back, another database, or this transaction under an
		// older snapshot (REPEATABLE READ): not visible, and the enqueue notifies. A
		// visible row of this transaction is covered too: its notification goes out
		// at this commit. created_at (the inserting transaction's start) tells that
		// row from another with the same key; an update (queued, done) keeps it.
		//
		// A row that left its notification out gets notify_late, the channel: the
		// trigger of migration 00015 notifies at this transaction's commit if the
		// commit comes too late for those follow-up rounds.
		Enqueue: fmt.Sprintf(`WITH ins AS (
	INSERT INTO %[1]s (queue, task_id, run_at, payload, max_attempts, trace_context, start_by, priority, concurrency_key, notify_late)
	SELECT $1, $2, v.run_at, $5, $6, $7::text, $8::timestamptz, $9::smallint, $12::text,
	       CASE WHEN %[2]s AND EXISTS (SELECT FROM %[1]s WHERE queue = $1 AND task_id = $10 AND created_at = $11::timestamptz)
	            THEN '%[3]s' END
	FROM (SELECT COALESCE($3::timestamptz, statement_timestamp() + $4::bigint * interval '1 microsecond') AS run_at) AS v
	ON CONFLICT (queue, task_id) DO NOTHING
	RETURNING run_at, created_at, notify_late
)
SELECT run_at, %[4]s, created_at FROM ins`, table, soon, cfg.NotifyChannel,
			notify("$1::text", "(SELECT 1 FROM ins WHERE "+soon+" AND notify_late IS NULL) AS v")),
		// EnqueueStartBy is Enqueue for a task with a start deadline ($8 set), which
		// the statement checks against the due time. A task without one (most)
		// takes Enqueue, which spends nothing on the check (its CTE and second
		// branch, on every producer's transaction: BENCHMARKS.md, issue 29).
		EnqueueStartBy: fmt.Sprintf(`WITH due AS (
	SELECT r.run_at, greatest(r.run_at, statement_timestamp()) AS due,
	       CASE WHEN $8::timestamptz < greatest(r.run_at, statement_timestamp())
	            THEN NOT EXISTS (SELECT FROM %[1]s WHERE queue = $1 AND task_id = $2) ELSE false END AS late
	FROM (SELECT COALESCE($3::timestamptz, statement_timestamp() + $4::bigint * interval '1 microsecond') AS run_at) AS r
), ins AS (
	INSERT INTO %[1]s (queue, task_id, run_at, payload, max_attempts, trace_context, start_by, priority, concurrency_key, notify_late)
	SELECT $1, $2, due.run_at, $5, $6, $7::text, $8::timestamptz, $9::smallint, $12::text,
	       CASE WHEN %[2]s AND EXISTS (SELECT FROM %[1]s WHERE queue = $1 AND task_id = $10 AND created_at = $11::timestamptz)
	            THEN '%[3]s' END
	FROM due WHERE NOT due.late
	ON CONFLICT (queue, task_id) DO NOTHING
	RETURNING run_at, created_at, notify_late
)
SELECT run_at, %[4]s, created_at FROM ins
UNION ALL
SELECT due, -1, NULL FROM due WHERE late`, table, soon, cfg.NotifyChannel,
			notify("$1::text", "(SELECT 1 FROM ins WHERE "+soon+" AND notify_late IS NULL) AS v")),

		// Arrays, one element per task, duplicates within the batch already removed:
		// $1 queue, $2 task_id, $3 run_at (NULL: use the delay), $4 delay (an
		// interval of microseconds: added exactly, so the caller can tell the run_at
		// from statement_timestamp()), $5 payload, $6 max_attempts, $7 trace_context
		// (NULL for the whole batch when no task has one), $8 start_by (NULL: none),
		// $9 priority (NULL for the whole batch when every task has 0), $10
		// concurrency_key (NULL for the whole batch when no task has one).
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
		//
		// A start deadline before its task's due time (as in Enqueue: exact on the
		// database clock; a task whose key exists is a duplicate) refuses the whole batch: nothing is inserted (a one-time
		// filter on late, which runs before the first row) and one more row, marked
		// n = -2, gives the first such task's due time and position (1-based, in
		// the arrays' order) in place of the notification count.
		EnqueueMany: fmt.Sprintf(`WITH late AS (
	SELECT k.i, greatest(COALESCE(k.run_at, statement_timestamp() + k.delay), statement_timestamp()) AS due
	FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::interval[], $8::timestamptz[]) WITH ORDINALITY AS k(queue, task_id, run_at, delay, start_by, i)
	WHERE CASE WHEN k.start_by < greatest(COALESCE(k.run_at, statement_timestamp() + k.delay), statement_timestamp())
	           THEN NOT EXISTS (SELECT FROM %[1]s t WHERE t.queue = k.queue AND t.task_id = k.task_id) ELSE false END
	ORDER BY k.i
	LIMIT 1
), ins AS (
	INSERT INTO %[1]s (queue, task_id, run_at, payload, max_attempts, trace_context, start_by, priority, concurrency_key)
	SELECT u.queue, u.task_id, COALESCE(u.run_at, statement_timestamp() + u.delay), u.payload, u.max_attempts, u.trace, u.start_by, COALESCE(u.priority, 0), u.ckey
	FROM (SELECT unnest($1::text[]) AS queue, unnest($2::text[]) AS task_id,
	             unnest($3::timestamptz[]) AS run_at, unnest($4::interval[]) AS delay,
	             unnest($5::bytea[]) AS payload, unnest($6::int[]) AS max_attempts,
	             unnest(COALESCE($7::text[], '{}')) AS trace,
	             unnest($8::timestamptz[]) AS start_by,
	             unnest(COALESCE($9::smallint[], '{}')) AS priority,
	             unnest(COALESCE($10::text[], '{}')) AS ckey) AS u
	WHERE NOT EXISTS (SELECT FROM late)
	ON CONFLICT (queue, task_id) DO NOTHING
	RETURNING queue, task_id, run_at
), c AS (
	SELECT count(*) AS n FROM ins
)
SELECT c.n, statement_timestamp(), %[2]s, ''::text, ''::text FROM c
UNION ALL
SELECT -1, statement_timestamp(), 0, queue, task_id FROM ins
WHERE (SELECT n FROM c) < cardinality($2::text[])
UNION ALL
SELECT -2, late.due, late.i, ''::text, ''::text FROM late`, table, notify("d.queue", "(SELECT DISTINCT queue FROM ins WHERE "+soon+") AS d")),

		// EnqueueReplace is Enqueue with a conflict policy (outbox Task.Replace,
		// Task.Debounce): $1 queue, $2 task_id, $3 run_at or NULL, $4 delay in µs,
		// $5 payload, $6 max_attempts, $7 trace_context or NULL, $8 priority, $9 the
		// policy (ConflictReplace, ConflictKeepRunAt, ConflictDebounce), $10 the
		// debounce window in µs, $11 the debounce's maximum wait in µs (0: none),
		// $12 concurrency_key or NULL (an insert's; a replace keeps the row's).
		//
		// A new key is inserted (version 1); a debounced one is due after the window,
		// capped at created_at (the transaction's start) plus the maximum wait. An
		// existing row still to run takes the payload and the due time as a new
		// version, as a reschedule does: pending (a queued one keeps queued_at, so the
		// relay replaces its copy in Redis at once, TakeDue's second branch), or
		// waiting still. The due time: the new one (replace), the row's (keep run
		// at), or the later of the row's and now plus the window, capped at the row's
		// created_at plus the maximum wait (debounce: never earlier, so concurrent
		// debounces leave it monotone). The unique key's arbiter makes it atomic: a
		// concurrent insert or update of the key is waited for and the update applies
		// to its result (READ COMMITTED).
		//
		// Not applied (no row returned, the row locked all the same): a queued row
		// already due (its worker may be running it), a finished row, or a start
		// deadline before the new due time; ConflictRow tells which. Returns the
		// version (1: inserted), run_at and the notification count: at every commit
		// (no cooldown) when the row is pending and due within NotifyWithin or its
		// older version is in Redis.
		EnqueueReplace: fmt.Sprintf(`WITH ins AS (
	INSERT INTO %[1]s AS t (queue, task_id, run_at, payload, max_attempts, trace_context, priority, concurrency_key)
	SELECT $1, $2, CASE WHEN $9::smallint = %[4]d
	                    THEN CASE WHEN $11::bigint > 0 THEN least(v.quiet, now() + $11::bigint * interval '1 microsecond') ELSE v.quiet END
	                    ELSE v.run_at END,
	       $5, $6, $7::text, $8::smallint, $12::text
	FROM (SELECT COALESCE($3::timestamptz, statement_timestamp() + $4::bigint * interval '1 microsecond') AS run_at,
	             statement_timestamp() + $10::bigint * interval '1 microsecond' AS quiet) AS v
	ON CONFLICT (queue, task_id) DO UPDATE
	SET payload = excluded.payload, run_at = %[2]s,
	    state = CASE WHEN t.state = 'waiting' THEN 'waiting' ELSE 'pending' END, version = t.version + 1
	WHERE (t.state IN ('pending', 'waiting') OR t.state = 'queued' AND t.run_at > statement_timestamp())
	  AND (t.start_by IS NULL OR t.start_by >= greatest(%[2]s, statement_timestamp()))
	RETURNING t.version, t.run_at, t.state, t.queued_at
)
SELECT version, run_at, %[3]s FROM ins`, table,
			fmt.Sprintf(`CASE $9::smallint WHEN %d THEN excluded.run_at WHEN %d THEN t.run_at
	    ELSE greatest(t.run_at, CASE WHEN $11::bigint > 0
	        THEN least(statement_timestamp() + $10::bigint * interval '1 microsecond', t.created_at + $11::bigint * interval '1 microsecond')
	        ELSE statement_timestamp() + $10::bigint * interval '1 microsecond' END) END`, ConflictReplace, ConflictKeepRunAt),
			notify("$1::text", "(SELECT 1 FROM ins WHERE state = 'pending' AND (queued_at IS NOT NULL OR "+soon+")) AS v"), ConflictDebounce),
		// $1 queue, $2 task_id: the row EnqueueReplace left, locked by it: whether
		// it has yet to finish (pending, queued, waiting), whether it is queued and
		// due (its worker may be running it), its start deadline. No row: none.
		ConflictRow: fmt.Sprintf(`SELECT state IN ('pending', 'queued', 'waiting'), state = 'queued' AND run_at <= statement_timestamp(), start_by
FROM %s WHERE queue = $1 AND task_id = $2`, table),

		// $1 queue, $2 task_id.
		// A waiting task (workflow) is cancelled too; its own dependents settle
		// in the same statement (migration 00021's trigger).
		Cancel: fmt.Sprintf(`UPDATE %s
SET state = 'cancelled', done_at = statement_timestamp(), payload = %s
WHERE queue = $1 AND task_id = $2 AND state IN ('pending', 'queued', 'waiting')`, table, clear),

		// $1 queue, $2 task_id, $3 run_at. Back to pending with a new version: the relay
		// puts it in Redis again, replacing the older version there, and a worker holding
		// the older version cannot complete it. queued_at stays: a row whose older
		// version is in Redis is moved by the relay at once, however far its run_at
		// (TakeDue), and it notifies at commit whatever its run_at, so the older version
		// is replaced within the relay's lag, not after a poll.
		// A start deadline before the new run time (or already past) refuses the
		// move, as it refuses an enqueue: the task could never start. A waiting
		// task (workflow) keeps waiting, with the new run time and version.
		Reschedule: fmt.Sprintf(`WITH upd AS (
	UPDATE %s
	SET run_at = $3, state = CASE WHEN state = 'waiting' THEN 'waiting' ELSE 'pending' END, version = version + 1
	WHERE queue = $1 AND task_id = $2 AND state IN ('pending', 'queued', 'waiting')
	  AND (start_by IS NULL OR start_by >= greatest($3, statement_timestamp()))
	RETURNING version, run_at, queued_at, state
)
SELECT version, %s FROM upd`, table, notify("$1::text", "(SELECT 1 FROM upd WHERE state = 'pending' AND (queued_at IS NOT NULL OR "+soon+")) AS v")),

		// $1 queue, $2 task_id, $3 version, $4 result: the run of that version
		// stores its result, in its handler's transaction (before the guard,
		// which commits with it). Nothing for another version or a finished row:
		// the guard refuses that run anyway.
		SetResult: fmt.Sprintf(`UPDATE %s SET result = $4
WHERE queue = $1 AND task_id = $2 AND version = $3 AND state IN ('pending', 'queued')`, table),
		// $1 queue, $2 task_id.
		ReadResult: fmt.Sprintf(`SELECT state, result FROM %s WHERE queue = $1 AND task_id = $2`, table),

		// EnqueueWaiting is the insert of a task waiting on others (package
		// workflow; migration 00021). $1 queue, $2 task_id, $3 run_at or NULL, $4
		// delay in µs, $5 payload, $6 max_attempts, $7 trace_context or NULL, $8
		// start_by or NULL, $9 priority; arrays $10 the dependencies' queues, $11
		// their ids, $12 their policies (fail, skip, run), without duplicates; $13
		// concurrency_key or NULL.
		//
		// The dependencies' rows are locked (in key order: two enqueues wait for
		// each other rather than deadlock), so a completion of one either
		// committed before (this statement sees it finished) or waits for this
		// transaction (its trigger then finds the edge). Those finished count at
		// once: done, or dead or cancelled with the policy run; a dead or
		// cancelled one with the policy fail makes the new task dead (and marked
		// for its OnDead hook), with skip cancelled, the first such in the
		// arrays' order giving the reason. Otherwise the task is pending when
		// none is left (the relay notified), else waiting with waits_for the
		// unfinished ones, each of which gets an edge and its has_dependents flag.
		//
		// Nothing is written when a dependency has no row: the one row returned
		// then names the missing ones (1-based positions). Else it gives the
		// insert's run_at and state, NULL for a duplicate (the key exists:
		// nothing written, its dependencies untouched).
		EnqueueWaiting: fmt.Sprintf(`WITH k AS (
	SELECT * FROM unnest($10::text[], $11::text[], $12::text[]) WITH ORDINALITY AS k(queue, task_id, on_failure, i)
), d AS (
	SELECT o.queue, o.task_id, o.state, k.on_failure, k.i,
	       'dependency ' || o.queue || '/' || o.task_id || ' ' || o.state
	       || CASE WHEN COALESCE(o.last_error, '') <> '' THEN ': ' || o.last_error ELSE '' END AS reason
	FROM %[1]s o JOIN k ON o.queue = k.queue AND o.task_id = k.task_id
	ORDER BY o.queue, o.task_id
	FOR UPDATE OF o
), s AS (
	SELECT count(*) AS found,
	       count(*) FILTER (WHERE state IN ('pending', 'queued', 'waiting')) AS open,
	       left((array_agg(reason ORDER BY i) FILTER (WHERE state IN ('dead', 'cancelled') AND on_failure = 'fail'))[1], 1024) AS fail,
	       left((array_agg(reason ORDER BY i) FILTER (WHERE state IN ('dead', 'cancelled') AND on_failure = 'skip'))[1], 1024) AS skip
	FROM d
), ins AS (
	INSERT INTO %[1]s (queue, task_id, run_at, payload, max_attempts, trace_context, start_by, priority,
	                   concurrency_key, state, waits_for, last_error, done_at, hook_due)
	SELECT $1, $2, COALESCE($3::timestamptz, statement_timestamp() + $4::bigint * interval '1 microsecond'),
	       $5, $6, $7::text, $8::timestamptz, $9::smallint, $13::text,
	       CASE WHEN s.fail IS NOT NULL THEN 'dead' WHEN s.skip IS NOT NULL THEN 'cancelled'
	            WHEN s.open = 0 THEN 'pending' ELSE 'waiting' END,
	       CASE WHEN s.fail IS NULL AND s.skip IS NULL AND s.open > 0 THEN s.open END,
	       COALESCE(s.fail, s.skip),
	       CASE WHEN s.fail IS NOT NULL OR s.skip IS NOT NULL THEN statement_timestamp() END,
	       CASE WHEN s.fail IS NOT NULL THEN statement_timestamp() END
	FROM s WHERE s.found = cardinality($10::text[])
	ON CONFLICT (queue, task_id) DO NOTHING
	RETURNING run_at, state
), flag AS (
	UPDATE %[1]s o SET has_dependents = true
	FROM d, ins
	WHERE ins.state = 'waiting' AND d.state IN ('pending', 'queued', 'waiting')
	  AND o.queue = d.queue AND o.task_id = d.task_id AND o.has_dependents IS NOT TRUE
	RETURNING 1
), edges AS (
	INSERT INTO %[2]s (queue, task_id, dep_queue, dep_task_id, on_failure, channel)
	SELECT d.queue, d.task_id, $1, $2, d.on_failure, '%[3]s'
	FROM d, ins
	WHERE ins.state = 'waiting' AND d.state IN ('pending', 'queued', 'waiting')
	RETURNING 1
)
SELECT ins.run_at, ins.state,
       ARRAY(SELECT k.i::int FROM k WHERE NOT EXISTS (SELECT FROM d WHERE d.i = k.i) ORDER BY k.i),
       (SELECT count(*) FROM flag) + (SELECT count(*) FROM edges),
       (SELECT count(*) FROM (SELECT pg_notify(CASE WHEN ins.state = 'pending' THEN '%[3]s' ELSE '%[4]s' END, $1::text)
                              FROM ins WHERE ins.state IN ('pending', 'dead')) AS n)
FROM (SELECT 1) AS one LEFT JOIN ins ON true`, table, cfg.depsTable(), cfg.NotifyChannel, cfg.HookChannel()),

		// $1 queue, $2 task_id.
		Row: fmt.Sprintf(`SELECT state, version, COALESCE(last_error, ''), start_by FROM %s WHERE queue = $1 AND task_id = $2`, table),
		// $1 queue, $2 task ids.
		Rows: fmt.Sprintf(`SELECT task_id, state, version, COALESCE(last_error, '') FROM %s WHERE queue = $1 AND task_id = ANY($2::text[])`, table),

		// The guard alone: it commits on its own, and the caller reads a refusal
		// from the count of updated rows.
		Guard: guard,

		// The guard of a transactional run, sent together with the COMMIT. When it
		// matches no row (a finished task, another version) it divides by zero: the
		// error aborts the transaction, so the COMMIT queued behind it cannot commit
		// the handler's writes (SQLSTATE 22012).
		GuardAbort: `WITH done AS (` + guard + `
	RETURNING 1
)
SELECT 1 / count(*) FROM done`,

		// Arrays $1 queue, $2 task_id, $3 version, $4 clear the payload: the guard
		// for many tasks in one statement. The rows are locked in key order first,
		// so that two overlapping batches wait for each other instead of
		// deadlocking, and so are the batch shards of their children (shards).
		// Returns the keys it marked done.
		GuardMany: fmt.Sprintf(`WITH locked AS (
	SELECT t.queue, t.task_id, k.clear, t.batch_id, t.batch_shard
	FROM %[1]s t
	JOIN unnest($1::text[], $2::text[], $3::int[], $4::boolean[]) AS k(queue, task_id, version, clear)
	  ON t.queue = k.queue AND t.task_id = k.task_id AND t.version = k.version
	WHERE t.state IN ('pending', 'queued')
	ORDER BY t.queue COLLATE "C", t.task_id COLLATE "C"
	FOR UPDATE OF t
), shards AS MATERIALIZED (`+lockBatchShards+`)
UPDATE %[1]s t
SET state = 'done', done_at = statement_timestamp(),
    payload = CASE WHEN l.clear OR %[2]t THEN ''::bytea ELSE t.payload END
FROM locked l, shards
WHERE t.queue = l.queue AND t.task_id = l.task_id
RETURNING t.queue, t.task_id`, table, cfg.ClearPayloadOnDone, cfg.lockBatchShardsFunc()),

		// Arrays $1 queue, $2 task_id, $3 version, $4 clear the payload, $5 the run
		// wrote: the guards of a group commit's runs, in one statement ahead of its
		// COMMIT (QueueGuardGroup). As GuardMany, and it returns the 1-based index
		// of each completion it marked done (one row with NULL when none). When the
		// guard of a run that wrote matches no row, it divides by zero instead: the
		// error aborts the transaction, so the COMMIT queued behind it cannot commit
		// that run's writes (SQLSTATE 22012). A key given twice is marked done once:
		// the other is refused.
		GuardGroup: fmt.Sprintf(`WITH k AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::boolean[], $5::boolean[])
	  WITH ORDINALITY AS k(queue, task_id, version, clear, wrote, i)
), locked AS (
	SELECT t.queue, t.task_id, k.clear, k.i, t.batch_id, t.batch_shard
	FROM %[1]s t
	JOIN k ON t.queue = k.queue AND t.task_id = k.task_id AND t.version = k.version
	WHERE t.state IN ('pending', 'queued')
	ORDER BY t.queue COLLATE "C", t.task_id COLLATE "C"
	FOR UPDATE OF t
), shards AS MATERIALIZED (`+lockBatchShards+`), done AS (
	UPDATE %[1]s t
	SET state = 'done', done_at = statement_timestamp(),
	    payload = CASE WHEN l.clear OR %[2]t THEN ''::bytea ELSE t.payload END
	FROM locked l, shards
	WHERE t.queue = l.queue AND t.task_id = l.task_id
	RETURNING l.i
), refused AS (
	SELECT count(*) AS n FROM k
	WHERE k.wrote AND NOT EXISTS (SELECT 1 FROM done d WHERE d.i = k.i)
)
SELECT d.i FROM refused r LEFT JOIN done d ON true
WHERE 1 / (r.n = 0)::int = 1`, table, cfg.ClearPayloadOnDone, cfg.lockBatchShardsFunc()),

		// $1 queue, $2 task_id, $3 version, $4 attempt, $5 last_error, $6 dead,
		// $7 the delay before the next run in µs, $8 a dead task's OnDead hook is
		// still to run (the hook-pending mark; the worker that records it wakes its
		// own sweep), $9 the error for the attempt history, $10 a panic's stack
		// (NULL: none). A retry writes its next run time, so a Redis rebuilt from
		// Postgres keeps the backoff. The run is appended to the attempt history
		// (retried or dead); $9 NULL appends nothing: the death of a run whose retry
		// is recorded already (Redis counted its attempts out) turns that entry dead.
		RecordFailure: fmt.Sprintf(`UPDATE %s
SET attempt = $4, last_error = $5,
    attempt_log = CASE WHEN $9::text IS NOT NULL THEN `+logAppend("attempt_log", `$4::int, $3::int, CASE WHEN $6::boolean THEN 'dead' ELSE 'retried' END, $9::text, $10::text`)+`
                       WHEN $6::boolean AND jsonb_typeof(attempt_log) = 'array' THEN jsonb_set(attempt_log, '{-1,outcome}', '"dead"')
                       ELSE attempt_log END,
    state = CASE WHEN $6::boolean THEN 'dead' ELSE state END,
    done_at = CASE WHEN $6::boolean THEN statement_timestamp() ELSE done_at END,
    run_at = CASE WHEN $6::boolean THEN run_at ELSE statement_timestamp() + $7::bigint * interval '1 microsecond' END,
    hook_due = CASE WHEN $6::boolean AND $8::boolean THEN statement_timestamp() ELSE hook_due END
WHERE queue = $1 AND task_id = $2 AND version = $3 AND state IN ('pending', 'queued')`, table),

		// $1 queue, $2 task_id, $3 version, $4 attempt, $5 error: a run that
		// failed after its lease was lost, appended to the attempt history
		// (lease_lost) whatever the row's state at that version; nothing else
		// changes (the run that holds the task now decides).
		NoteLost: fmt.Sprintf(`UPDATE %s
SET attempt_log = `+logAppend("attempt_log", `$4::int, $3::int, 'lease_lost', $5::text, NULL::text`)+`
WHERE queue = $1 AND task_id = $2 AND version = $3`, table),

		// $1 queue, $2 task_id, $3 version, $4 the delay before the next run in µs:
		// a run that asked to run again later (or whose dead hook failed). The
		// attempt is not counted; the run time is kept for a Redis rebuilt from
		// Postgres.
		Snooze: fmt.Sprintf(`UPDATE %s
SET run_at = statement_timestamp() + $4::bigint * interval '1 microsecond'
WHERE queue = $1 AND task_id = $2 AND version = $3 AND state IN ('pending', 'queued')`, table),

		// $1 queue, $2 task_id, $3 version, $4 attempt, $5 reason, $6 the reason
		// for the attempt history: a run that cancelled its task (its effect
		// rolled back).
		CancelRun: fmt.Sprintf(`UPDATE %s
SET state = 'cancelled', done_at = statement_timestamp(), attempt = $4, last_error = $5, payload = %s,
    attempt_log = `+logAppend("attempt_log", `$4::int, $3::int, 'cancelled', $6::text, NULL::text`)+`
WHERE queue = $1 AND task_id = $2 AND version = $3 AND state IN ('pending', 'queued')`, table, clear),

		// $1 queue, $2 task_id, $3 version, $4 reason: a task claimed after its
		// start deadline is dead with the reason, never run (its attempts as
		// recorded: the claim that found it late ran nothing).
		MissDeadline: fmt.Sprintf(`UPDATE %s
SET state = 'dead', done_at = statement_timestamp(), last_error = $4
WHERE queue = $1 AND task_id = $2 AND version = $3 AND state IN ('pending', 'queued')
  AND start_by IS NOT NULL`, table),

		TakeDue:       fmt.Sprintf(takeDue, table, ""),
		TakeDueQueues: fmt.Sprintf(takeDue, table, " AND queue = ANY($3::text[])"),
		ShardedQueues: fmt.Sprintf(`SELECT queue, shards FROM %s WHERE shards > 1`, cfg.queuesTable()),
		NextDue:       fmt.Sprintf(nextDue, table, ""),
		NextDueQueues: fmt.Sprintf(nextDue, table, " AND queue = ANY($1::text[])"),

		// $1 ctids, $2 errors: rows of the round that Redis would refuse, by the
		// ctids TakeDue returned; they wait for a person like any dead task. The
		// relay runs no application code: the rows are marked for their OnDead
		// hook (hook_due), and the workers sweeping their queues are notified at
		// the round's commit. A batch child's shard is locked first, sorted, as
		// the guards lock it (lockBatchShards). Returns the count of rows and of
		// notifications.
		MarkInvalid: fmt.Sprintf(`WITH locked AS (
	SELECT ctid, batch_id, batch_shard FROM %[1]s WHERE ctid = ANY($1::tid[]) FOR UPDATE
), shards AS MATERIALIZED (`+lockBatchShards+`), upd AS (
	UPDATE %[1]s
	SET state = 'dead', last_error = ($2::text[])[array_position($1::tid[], ctid)], done_at = now(), hook_due = now()
	FROM shards
	WHERE ctid = ANY($1::tid[])
	RETURNING queue
)
SELECT (SELECT count(*) FROM upd), %[2]s`, table, notifyHook, cfg.lockBatchShardsFunc()),

		// $1 queues, $2 task ids, $3 versions, $4 attempts, $5 errors: tasks the
		// reaper found out of attempts. The guard leaves finished rows and newer
		// versions (a reschedule) alone. The rows are marked for their OnDead hook
		// (hook_due), and the workers sweeping their queues are notified at commit.
		// As GuardMany, the rows are locked in key order and the shards of the
		// batch children among them sorted, before the update (lockBatchShards):
		// a reap and a group commit of one batch wait for each other, never
		// deadlock. Returns the keys it marked dead.
		MarkDead: fmt.Sprintf(`WITH locked AS (
	SELECT o.queue, o.task_id, u.version, u.attempt, u.err, o.batch_id, o.batch_shard
	FROM %[1]s o
	JOIN unnest($1::text[], $2::text[], $3::int[], $4::int[], $5::text[]) AS u(queue, task_id, version, attempt, err)
	  ON o.queue = u.queue AND o.task_id = u.task_id AND o.version = u.version
	WHERE o.state IN ('pending', 'queued')
	ORDER BY o.queue COLLATE "C", o.task_id COLLATE "C"
	FOR UPDATE OF o
), shards AS MATERIALIZED (`+lockBatchShards+`), upd AS (
	UPDATE %[1]s AS o
	SET state = 'dead', last_error = l.err, attempt = GREATEST(o.attempt, l.attempt), done_at = now(), hook_due = now(),
	    attempt_log = `+logAppend("o.attempt_log", `l.attempt, l.version, 'lease_expired', NULL::text, NULL::text`)+`
	FROM locked l, shards
	WHERE o.queue = l.queue AND o.task_id = l.task_id
	RETURNING o.queue, o.task_id
)
SELECT queue, task_id, %[2]s FROM upd`, table, notifyHook, cfg.lockBatchShardsFunc()),

		// $1 queues with a hook. The next marked dead row of those queues whose
		// hook is due, locked (rows another worker's sweep holds are skipped) and
		// its mark cleared: the caller runs the hook in the same transaction, so
		// the hook's writes and the clearing commit together. Returns the task as
		// a hook sees it and the time of its death.
		TakeDeadHook: fmt.Sprintf(`UPDATE %[1]s
SET hook_due = NULL
WHERE ctid = (
	SELECT ctid FROM %[1]s
	WHERE hook_due IS NOT NULL AND hook_due <= now() AND queue = ANY($1::text[]) AND state = 'dead'
	ORDER BY hook_due
	LIMIT 1
	FOR UPDATE SKIP LOCKED
)
RETURNING queue, task_id, version, attempt, max_attempts, run_at, payload, COALESCE(last_error, ''),
          COALESCE(trace_context, ''), start_by, done_at`, table),

		// $1 queue, $2 task_id, $3 version, $4 delay in µs: the row TakeDeadHook
		// took in this transaction, marked again for a hook that failed (from
		// now, not from the transaction's start: the hook took its time).
		DelayDeadHook: fmt.Sprintf(`UPDATE %s
SET hook_due = statement_timestamp() + $4::bigint * interval '1 microsecond'
WHERE queue = $1 AND task_id = $2 AND version = $3 AND state = 'dead'`, table),

		// $1 queues with a hook. How long until the earliest mark of those queues
		// falls due, in µs (0 or less: due now, held by another worker's sweep;
		// NULL: no mark).
		NextDeadHook: fmt.Sprintf(`SELECT (extract(epoch FROM min(hook_due) - now()) * 1000000)::bigint
FROM %s WHERE hook_due IS NOT NULL AND queue = ANY($1::text[]) AND state = 'dead'`, table),

		// The queues with queued rows, by a loose index scan of
		// delayq_outbox_queued_idx: one index probe per queue, however many rows.
		QueuedQueues: fmt.Sprintf(`WITH RECURSIVE q(queue) AS (
	(SELECT queue FROM %[1]s WHERE state = 'queued' ORDER BY queue LIMIT 1)
	UNION ALL
	SELECT (SELECT o.queue FROM %[1]s AS o
	        WHERE o.state = 'queued' AND o.queue > q.queue ORDER BY o.queue LIMIT 1)
	FROM q WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL`, table),

		// $1 cap. The live and dead rows, counted over their partial indexes
		// (index-only scans), each up to the cap, so the cost stays bounded however
		// large a backlog grows; a count at the cap means "at least".
		DepthLive: fmt.Sprintf(`SELECT (SELECT count(*) FROM (SELECT 1 FROM %[1]s WHERE state = 'pending' LIMIT $1) AS p),
       (SELECT count(*) FROM (SELECT 1 FROM %[1]s WHERE state = 'queued' LIMIT $1) AS q),
       (SELECT count(*) FROM (SELECT 1 FROM %[1]s WHERE state = 'dead' LIMIT $1) AS d)`, table),
		// $1 schema. Estimates of the done and cancelled rows, from the
		// planner's statistics (ANALYZE, autovacuum): the table's row count times
		// each state's frequency. Cheap at any size; as fresh as the statistics.
		DepthFinished: `SELECT s.state, (s.freq * greatest(c.reltuples, 0))::bigint
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = $1
CROSS JOIN LATERAL (
	SELECT unnest(most_common_vals::text::text[]) AS state, unnest(most_common_freqs) AS freq
	FROM pg_stats WHERE schemaname = $1 AND tablename = '` + TableName + `' AND attname = 'state'
) AS s
WHERE c.relname = '` + TableName + `' AND s.state IN ('done', 'cancelled')`,

		// $1 retention in µs, $2 batch. One short statement (its own transaction)
		// per batch: the rows are found in done_at order on
		// delayq_outbox_done_at_idx, locked (rows locked by someone else are left for
		// the next batch), and deleted by ctid, a TID scan; the locks keep the ctids
		// valid until the delete.
		Prune: fmt.Sprintf(`DELETE FROM %[1]s
WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM %[1]s
	WHERE done_at IS NOT NULL AND done_at < now() - $1::bigint * interval '1 microsecond'
	  AND state IN ('done', 'cancelled')
	ORDER BY done_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
))`, table),

		StateCounts:     fmt.Sprintf(`SELECT queue, state, count(*) FROM %s GROUP BY queue, state`, table),
		StateCountsSome: fmt.Sprintf(`SELECT queue, state, count(*) FROM %s WHERE queue = ANY($1::text[]) GROUP BY queue, state`, table),

		// The live, dead and waiting rows of each queue, exactly,
		// each state by an index-only scan of its partial index (every one holds the
		// queue); LiveCountsSome: of the queues $1. They cost what those rows are,
		// whatever the number of finished rows.
		LiveCounts:     fmt.Sprintf(liveCounts, table, ""),
		LiveCountsSome: fmt.Sprintf(liveCounts, table, " AND queue = ANY($1::text[])"),
		// $1 start, $2 minutes (and $3 queues): dueByMinute above.
		DueByMinute:     fmt.Sprintf(dueByMinute, table, ""),
		DueByMinuteSome: fmt.Sprintf(dueByMinute, table, " AND queue = ANY($3::text[])"),
		// $1 schema. The table's row count as the planner estimates it (the last
		// VACUUM or ANALYZE's count scaled to the table's current size, as the
		// planner does), and, one row each, the done and cancelled shares of each
		// queue from the extended statistics delayq_outbox_queue_state (migration
		// 00012; NULL queue when ANALYZE has not built them yet). Reads catalogs only.
		FinishedEstimate: `SELECT CASE WHEN c.relpages > 0 AND c.reltuples >= 0
            THEN c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::int)
            ELSE c.reltuples END,
       m.queue, m.state, m.freq
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = $1
LEFT JOIN LATERAL (
	SELECT s.most_common_vals[i][array_position(s.attnames, 'queue')] AS queue,
	       s.most_common_vals[i][array_position(s.attnames, 'state')] AS state,
	       s.most_common_freqs[i] AS freq
	FROM pg_stats_ext s, generate_subscripts(s.most_common_vals, 1) AS i
	WHERE s.schemaname = $1 AND s.tablename = '` + TableName + `' AND s.statistics_name = 'delayq_outbox_queue_state'
) AS m ON m.state IN ('done', 'cancelled')
WHERE c.relname = '` + TableName + `' AND c.relkind = 'r'`,

		// How long the oldest due pending row has waited for the relay, in seconds,
		// on the database clock; over the partial index of pending rows (an
		// index-only scan: it carries the queue).
		PendingLag: fmt.Sprintf(`SELECT queue, extract(epoch FROM now() - min(run_at))::float8
FROM %s WHERE state = 'pending' AND run_at <= now() GROUP BY queue`, table),
		PendingLagSome: fmt.Sprintf(`SELECT queue, extract(epoch FROM now() - min(run_at))::float8
FROM %s WHERE state = 'pending' AND run_at <= now() AND queue = ANY($1::text[]) GROUP BY queue`, table),

		// Every queue of the outbox by a loose index scan of the primary key: one
		// index probe per queue, however many rows.
		AllQueues: fmt.Sprintf(`WITH RECURSIVE q(queue) AS (
	(SELECT queue FROM %[1]s ORDER BY queue LIMIT 1)
	UNION ALL
	SELECT (SELECT o.queue FROM %[1]s AS o WHERE o.queue > q.queue ORDER BY o.queue LIMIT 1)
	FROM q WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL`, table),

		// $1 queue.
		CountQueue: fmt.Sprintf(`SELECT count(*) FROM %s WHERE queue = $1`, table),

		// $1 queue, $2 the last task id of the previous page ('' first), $3 limit.
		// Keyset pagination on the primary key: each page is an index range scan.
		Page: fmt.Sprintf(`SELECT task_id, state, version FROM %s
WHERE queue = $1 AND task_id > $2
ORDER BY task_id
LIMIT $3`, table),

		// $1 queue, $2 the last task id of the previous page ('' first), $3 limit:
		// Page of the queued rows alone, for the relay's anti-entropy. A range scan
		// of the primary key that skips the other rows.
		PageQueued: fmt.Sprintf(`SELECT task_id, state, version FROM %s
WHERE queue = $1 AND task_id > $2 AND state = 'queued'
ORDER BY task_id
LIMIT $3`, table),

		// $1 queue, $2 task ids: which of them have a row.
		Exists: fmt.Sprintf(`SELECT task_id FROM %s WHERE queue = $1 AND task_id = ANY($2::text[])`, table),

		// $1 queue, $2 task ids.
		Lookup: fmt.Sprintf(`SELECT %s FROM %s WHERE queue = $1 AND task_id = ANY($2::text[])`, RowColumns, table),

		// $1 queue, $2 task ids. Locks the rows for a repair, in key order; rows
		// another transaction holds (a worker completing, a relay, a cancel) are
		// skipped rather than waited for.
		Lock: fmt.Sprintf(`SELECT %s FROM %s WHERE queue = $1 AND task_id = ANY($2::text[])
ORDER BY task_id
FOR UPDATE SKIP LOCKED`, RowColumns, table),

		NotifyLateOff: fmt.Sprintf(`ALTER TABLE %s DISABLE TRIGGER delayq_outbox_notify_late`, table),

		// $1 queue, $2 task id ('': every task of the queue), $3 limit.
		Find: fmt.Sprintf(`SELECT task_id, state, version, attempt, max_attempts, run_at, payload FROM %s
WHERE queue = $1 AND ($2 = '' OR task_id = $2)
ORDER BY task_id
LIMIT $3`, table),

		// $1 queues (empty: all), $2 limit. Newest deaths first.
		ListDead: fmt.Sprintf(`SELECT queue, task_id, attempt, max_attempts, coalesce(last_error, ''), done_at, version
FROM %s
WHERE state = 'dead' AND (cardinality($1::text[]) = 0 OR queue = ANY($1::text[]))
ORDER BY done_at DESC NULLS LAST, queue, task_id
LIMIT $2`, table),

		// $1 queues (empty: all), $2 task ids (empty: all), $3 limit. Back to pending
		// as a new version, due now, attempts reset; the relay moves it (notified at
		// commit), and its enqueue replaces the dead record of the older version in
		// Redis. Postgres alone: nothing to undo if the caller rolls back. A mark
		// whose hook has not run yet is dropped with the death it was for: the
		// retried task lives again, and a later death brings its own hook.
		RetryDead: fmt.Sprintf(`WITH upd AS (
	UPDATE %[1]s AS o
	SET state = 'pending', attempt = 0, done_at = NULL, hook_due = NULL, run_at = statement_timestamp(), version = o.version + 1
	FROM (`+deadRows+`) AS d
	WHERE o.queue = d.queue AND o.task_id = d.task_id
	RETURNING o.queue, o.task_id
)
SELECT queue, task_id, %[2]s FROM upd`, table, notify("d.queue", "(SELECT DISTINCT queue FROM upd) AS d")),

		// $1 queue, $2 task_id, $3 the dead version the edit was made on, $4 the new
		// payload. RetryDead of one row, with its payload replaced: only while the
		// row is still that dead version, so an edit never overwrites a task that
		// was retried, purged and enqueued again, or edited by someone else.
		// Returns the new version and the notification count (no row: nothing done).
		RetryDeadEdited: fmt.Sprintf(`WITH upd AS (
	UPDATE %s
	SET payload = $4, state = 'pending', attempt = 0, done_at = NULL, hook_due = NULL, run_at = statement_timestamp(), version = version + 1
	WHERE queue = $1 AND task_id = $2 AND state = 'dead' AND version = $3
	RETURNING version
)
SELECT version, %s FROM upd`, table, notify("$1::text", "upd")),

		// $1 queues (empty: all), $2 task ids (empty: all), $3 limit.
		PurgeDead: fmt.Sprintf(`DELETE FROM %[1]s AS o
USING (`+deadRows+`) AS d
WHERE o.queue = d.queue AND o.task_id = d.task_id
RETURNING o.queue, o.task_id, o.version`, table),
	}
	batchStatements(&s, cfg)
	return s
}

// The conflict policies of EnqueueReplace ($9).
const (
	// ConflictReplace replaces the payload and the due time with the new ones.
	ConflictReplace = 1
	// ConflictKeepRunAt replaces the payload and keeps the row's due time.
	ConflictKeepRunAt = 2
	// ConflictDebounce replaces the payload and pushes the due time back by the
	// window, capped at created_at plus the maximum wait.
	ConflictDebounce = 3
)

// lockBatchShards is the body of the CTE shards of GuardMany, GuardGroup,
// MarkDead and MarkInvalid: the shard rows (migration 00030) of the batch
// children among the rows locked, locked sorted before the update by
// delayq_lock_batch_shards. The update's trigger (delayq_outbox_batch) updates
// them in the update's order, which another such statement may take in
// another: without this, two group commits of one batch, or a reap and a group
// commit, could deadlock. With no batch child among the rows the function gets
// NULL arrays and never reads the shards' table, so a role that finishes no
// batch child needs no privilege on it. %[3]s is the function.
const lockBatchShards = `
	SELECT %[3]s(array_agg(batch_id ORDER BY batch_id, batch_shard), array_agg(batch_shard ORDER BY batch_id, batch_shard))
	FROM locked WHERE batch_shard IS NOT NULL
`
