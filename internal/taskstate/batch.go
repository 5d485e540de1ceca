package taskstate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// BatchesTableName holds one counter row per batch (package workflow,
// Client.Batch), created by migration 00024; its trigger delayq_outbox_batch
// counts each child's finish and releases the callback.
const BatchesTableName = "delayq_batches"

// BatchShardsTableName holds a batch's counts spread over up to BatchShards
// rows (migration 00030): a child's finish updates its shard's row alone.
const BatchShardsTableName = "delayq_batch_shards"

// BatchShards is the most shards a batch's count is spread over: a batch of n
// children has min(n, BatchShards), child i (in key order) in shard i mod that.
const BatchShards = 16

// batchesTable returns the quoted, schema-qualified batches table.
func (c Config) batchesTable() string { return fmt.Sprintf(`"%s"."%s"`, c.Schema, BatchesTableName) }

// lockBatchShardsFunc returns the quoted, schema-qualified function that locks
// shard rows sorted (migration 00030).
func (c Config) lockBatchShardsFunc() string {
	return fmt.Sprintf(`"%s".delayq_lock_batch_shards`, c.Schema)
}

// batchShardsTable returns the quoted, schema-qualified shards table.
func (c Config) batchShardsTable() string {
	return fmt.Sprintf(`"%s"."%s"`, c.Schema, BatchShardsTableName)
}

// batchStatements fills the statements of batches and of the cancel of a
// workflow.
func batchStatements(s *Statements, cfg Config) {
	table, batches, shards := cfg.Table(), cfg.batchesTable(), cfg.batchShardsTable()
	soon := "true"
	if cfg.NotifyWithin > 0 {
		soon = fmt.Sprintf("run_at < statement_timestamp() + interval '%d microseconds'", cfg.NotifyWithin.Microseconds())
	}
	clear := "payload"
	if cfg.ClearPayloadOnDone {
		clear = "''::bytea"
	}

	// $1..$9 the callback as EnqueueWaiting's; arrays of the children, sorted
	// by key (bytewise) without repeats: $10 queues, $11 ids, $12 run_at (NULL:
	// use the delay), $13 delays, $14 payloads, $15 max_attempts, $16 trace
	// contexts (NULL for the whole batch when none has one), $17 start_by, $18
	// priorities (NULL when every one is 0); $19 the callback's concurrency_key
	// or NULL, $20 the children's (NULL for the whole batch when none has one).
	//
	// The callback is inserted waiting with a new batch id (nothing else is
	// written when its key exists: a duplicate batch); then the children, each
	// with the batch id, in key order as EnqueueMany does (two batches with
	// common children wait for each other instead of deadlocking), a child
	// whose key exists left out of the batch, each with its shard (its position
	// mod K, K = min(16, children given): neighbours in key order, which the
	// workers tend to run together, count on different rows); then the batch's
	// row, with the number inserted and the number of shards that got a child,
	// and a row per such shard with its children's count (migration 00030).
	// One row: the batch id (NULL for a duplicate), the
	// callback's run_at, the children inserted, the notification count (the
	// relay hears of the children due soon at the commit). A child's start
	// deadline is not checked against its due time here: a child that misses
	// it dies when claimed, and counts dead.
	s.EnqueueBatch = fmt.Sprintf(`WITH id AS (
	SELECT nextval('"%[4]s"."delayq_batches_id_seq"'::regclass) AS v
), cb AS (
	INSERT INTO %[1]s (queue, task_id, run_at, payload, max_attempts, trace_context, start_by, priority, state, batch_id, concurrency_key)
	SELECT $1, $2, COALESCE($3::timestamptz, statement_timestamp() + $4::bigint * interval '1 microsecond'),
	       $5, $6, $7::text, $8::timestamptz, $9::smallint, 'waiting', id.v, $19::text
	FROM id
	ON CONFLICT (queue, task_id) DO NOTHING
	RETURNING batch_id, run_at
), ins AS (
	INSERT INTO %[1]s (queue, task_id, run_at, payload, max_attempts, trace_context, start_by, priority, batch_id, batch_shard, concurrency_key)
	SELECT u.queue, u.task_id, COALESCE(u.run_at, statement_timestamp() + u.delay), u.payload, u.max_attempts, u.trace, u.start_by,
	       COALESCE(u.priority, 0), (SELECT batch_id FROM cb), u.shard, u.ckey
	FROM (SELECT unnest($10::text[]) AS queue, unnest($11::text[]) AS task_id,
	             unnest($12::timestamptz[]) AS run_at, unnest($13::interval[]) AS delay,
	             unnest($14::bytea[]) AS payload, unnest($15::int[]) AS max_attempts,
	             unnest(COALESCE($16::text[], '{}')) AS trace,
	             unnest($17::timestamptz[]) AS start_by,
	             unnest(COALESCE($18::smallint[], '{}')) AS priority,
	             unnest(COALESCE($20::text[], '{}')) AS ckey,
	             (generate_series(0, cardinality($11::text[]) - 1) %% least(%[6]d, greatest(cardinality($11::text[]), 1)))::smallint AS shard) AS u
	WHERE EXISTS (SELECT FROM cb)
	ON CONFLICT (queue, task_id) DO NOTHING
	RETURNING queue, run_at, batch_shard
), c AS (
	SELECT count(*)::int AS n, count(DISTINCT batch_shard)::smallint AS shards FROM ins
), b AS (
	INSERT INTO %[2]s (id, queue, task_id, total, remaining, shards, channel, finished_at)
	SELECT cb.batch_id, $1, $2, c.n, 0, c.shards, '%[3]s', CASE WHEN c.n = 0 THEN statement_timestamp() END
	FROM cb, c
	RETURNING id
), s AS (
	INSERT INTO %[7]s (batch_id, shard, remaining)
	SELECT (SELECT batch_id FROM cb), batch_shard, count(*) FROM ins GROUP BY batch_shard
)
SELECT (SELECT id FROM b), (SELECT run_at FROM cb), c.n,
       (SELECT count(*) FROM (SELECT pg_notify('%[3]s', d.queue) FROM (SELECT DISTINCT queue FROM ins WHERE %[5]s) AS d) AS n)
FROM c`, table, batches, cfg.NotifyChannel, cfg.Schema, soon, BatchShards, shards)

	// $1 queue, $2 task_id: the callback of a batch none of whose children was
	// inserted (each existed) runs at once; the relay notified at the commit.
	s.ReleaseBatch = fmt.Sprintf(`WITH upd AS (
	UPDATE %s SET state = 'pending' WHERE queue = $1 AND task_id = $2 AND state = 'waiting' AND batch_id IS NOT NULL
	RETURNING queue
)
SELECT count(pg_notify('%s', queue)) FROM upd`, table, cfg.NotifyChannel)

	// $1 queue, $2 task_id of the callback: its batch's id and counts, on
	// delayq_batches_callback_key.
	s.BatchRow = batchRow(cfg)

	// $1 queue, $2 task_id: the row's batch (NULL: in none, or counted) and that
	// batch's callback. No row: no task.
	s.BatchOf = fmt.Sprintf(`SELECT b.id, b.queue, b.task_id
FROM %s o LEFT JOIN %s b ON b.id = o.batch_id
WHERE o.queue = $1 AND o.task_id = $2`, table, batches)

	// $1 batch id, $2 queue, $3 task_id of its callback: the children of the
	// batch not finished are cancelled, locked in key order, and counted
	// cancelled in one update of the counter after them: their shards' rows
	// (migration 00030), then the batch's row (the shards they took to 0, and
	// the count of children enqueued before 00030, which have no shard). Their
	// batch_id is cleared in the same update, so the trigger does not count
	// them one by one: the counters are locked after the children, as a
	// finishing child's transaction locks them (its row, its shard, then the
	// batch's row), so a cancel and the completions of the batch wait for each
	// other without deadlock.
	// The callback is not touched: the caller cancels it next (Cancel), after
	// the counter. Returns the number cancelled.
	s.CancelBatch = fmt.Sprintf(`WITH k AS (
	SELECT queue, task_id, batch_shard FROM %[1]s
	WHERE batch_id = $1 AND state IN ('pending', 'queued', 'waiting') AND (queue, task_id) <> ($2, $3)
	ORDER BY queue COLLATE "C", task_id COLLATE "C"
	FOR UPDATE
), c AS (
	UPDATE %[1]s o SET state = 'cancelled', done_at = statement_timestamp(), payload = %[3]s, batch_id = NULL, batch_shard = NULL
	FROM k WHERE o.queue = k.queue AND o.task_id = k.task_id
	RETURNING k.batch_shard AS shard
), n AS (
	SELECT count(*)::int AS n, (count(*) FILTER (WHERE shard IS NULL))::int AS unsharded FROM c
), per AS (
	SELECT shard, count(*)::int AS n FROM c WHERE shard IS NOT NULL GROUP BY shard
), sh AS (
	UPDATE %[4]s s SET remaining = s.remaining - per.n, cancelled = s.cancelled + per.n
	FROM per WHERE s.batch_id = $1 AND s.shard = per.shard
	RETURNING s.remaining = 0 AS zero
), z AS (
	SELECT (count(*) FILTER (WHERE zero))::int AS z FROM sh
), counted AS (
	-- run to completion whether read or not, after every child (it reads n)
	UPDATE %[2]s b
	SET remaining = remaining - n.unsharded, cancelled = cancelled + n.unsharded,
	    zero_shards = zero_shards + z.z,
	    finished_at = CASE WHEN (remaining = n.unsharded AND n.unsharded > 0) OR (z.z > 0 AND zero_shards + z.z = shards)
	                       THEN statement_timestamp() ELSE finished_at END
	FROM n, z WHERE b.id = $1
	RETURNING 1
)
SELECT n FROM n`, table, batches, clear, shards)

	// Arrays $1 queues, $2 task ids, in dependency order (each task after
	// those it waits on): those not finished are cancelled in one statement,
	// locked in that order first, as a completion locks its row and then its
	// dependents' (the trigger delayq_outbox_release), so the two wait for
	// each other without deadlock. Returns the keys cancelled.
	s.CancelTasks = fmt.Sprintf(`WITH k AS (
	SELECT o.queue, o.task_id
	FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(queue, task_id, i)
	JOIN %[1]s o ON o.queue = k.queue AND o.task_id = k.task_id
	WHERE o.state IN ('pending', 'queued', 'waiting')
	ORDER BY k.i
	FOR UPDATE OF o
)
UPDATE %[1]s o SET state = 'cancelled', done_at = statement_timestamp(), payload = %[2]s
FROM k WHERE o.queue = k.queue AND o.task_id = k.task_id
RETURNING o.queue, o.task_id`, table, clear)
}

// batchRow reads a batch's counts: $1 queue, $2 task_id of its callback. They
// are its row's plus its shards' (a batch enqueued before migration 00030 has
// no shard; a sharded batch's row holds 0s), read in one snapshot.
func batchRow(cfg Config) string {
	return fmt.Sprintf(`SELECT b.id, b.total, b.remaining + COALESCE(s.remaining, 0), b.done + COALESCE(s.done, 0),
       b.dead + COALESCE(s.dead, 0), b.cancelled + COALESCE(s.cancelled, 0), b.created_at, b.finished_at
FROM %s b
LEFT JOIN LATERAL (
	SELECT sum(remaining)::int AS remaining, sum(done)::int AS done, sum(dead)::int AS dead, sum(cancelled)::int AS cancelled
	FROM %s WHERE batch_id = b.id
) s ON true
WHERE b.queue = $1 AND b.task_id = $2`, cfg.batchesTable(), cfg.batchShardsTable())
}

// Walk returns the keys of the tasks connected to queue/id by the edges still
// waiting (queue/id among them), in dependency order, at most bound of them;
// truncated says the walk stopped at its bound. The cancel of a workflow locks
// them in this order (CancelTasks).
func (d *Deps) Walk(ctx context.Context, q Querier, queue, id string, bound int) (queues, ids []string, truncated bool, err error) {
	rows, err := q.Query(ctx, d.SQL.Connected, queue, id, bound+1)
	if err != nil {
		return nil, nil, false, fmt.Errorf("walk from %s/%s: %w", queue, id, err)
	}
	var kq, kid string
	if _, err = pgx.ForEachRow(rows, []any{&kq, &kid}, func() error {
		queues, ids = append(queues, kq), append(ids, kid)
		return nil
	}); err != nil {
		return nil, nil, false, fmt.Errorf("walk from %s/%s: %w", queue, id, err)
	}
	if len(queues) > bound {
		return nil, nil, true, nil
	}
	key := func(q, id string) string { return q + "\x00" + id }
	nodes := make(map[string]*Node, len(queues))
	for i := range queues {
		nodes[key(queues[i], ids[i])] = &Node{BrowseRow: BrowseRow{Queue: queues[i], ID: ids[i]}}
	}
	rows, err = q.Query(ctx, d.SQL.Edges, queues, ids)
	if err != nil {
		return nil, nil, false, fmt.Errorf("walk from %s/%s: %w", queue, id, err)
	}
	var fq, fid, tq, tid, pol string
	if _, err = pgx.ForEachRow(rows, []any{&fq, &fid, &tq, &tid, &pol}, func() error {
		if n := nodes[key(tq, tid)]; n != nil && nodes[key(fq, fid)] != nil {
			n.waits = append(n.waits, key(fq, fid))
		}
		return nil
	}); err != nil {
		return nil, nil, false, fmt.Errorf("walk from %s/%s: %w", queue, id, err)
	}
	ordered := topoOrder(nodes)
	queues, ids = queues[:0], ids[:0]
	for _, n := range ordered {
		queues, ids = append(queues, n.Queue), append(ids, n.ID)
	}
	return queues, ids, false, nil
}

// BatchCounts is a batch's counter row (BatchRow).
type BatchCounts struct {
	ID                                      int64
	Total, Remaining, Done, Dead, Cancelled int
	CreatedAt                               time.Time
	FinishedAt                              time.Time // zero while children remain
}

// Batch reads the counter of the batch whose callback is queue/id (BatchRow);
// ok is false when queue/id is no batch's callback.
func (d *Deps) Batch(ctx context.Context, q Querier, queue, id string) (b BatchCounts, ok bool, err error) {
	var finished *time.Time
	err = q.QueryRow(ctx, d.SQL.BatchRow, queue, id).Scan(&b.ID, &b.Total, &b.Remaining, &b.Done, &b.Dead, &b.Cancelled, &b.CreatedAt, &finished)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return BatchCounts{}, false, nil
	case err != nil:
		return BatchCounts{}, false, fmt.Errorf("batch of %s/%s: %w", queue, id, err)
	}
	if finished != nil {
		b.FinishedAt = *finished
	}
	return b, true, nil
}
