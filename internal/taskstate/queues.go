package taskstate

import (
	"context"
	"errors"
	"fmt"
	"github.com/delayq/delayq/delayqtype"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/validate"
)

// QueuesTableName is the table of per-queue controls, created by package
// migrations (00004): whether a queue is paused, its rate limit, its shard count
// (00014), and the version of its controls, which the Redis mirror
// (dq:{queue}:ctl) is keyed by.
const QueuesTableName = "delayq_queues"

// QueueControl is one queue's row of the controls table (a public type).
type QueueControl = delayqtype.QueueControl

func (s *Store) queuesTable() string { return s.cfg.queuesTable() }

func (c Config) queuesTable() string { return fmt.Sprintf(`"%s".%s`, c.Schema, QueuesTableName) }

const queueColumns = `queue, paused, rate_limit, rate_period_ms, rate_burst, shards, version, updated_at,
	key_concurrency, key_throttle, key_window_ms`

func scanQueueControl(r pgx.Row) (QueueControl, error) {
	var c QueueControl
	var periodMS, windowMS int64
	err := r.Scan(&c.Queue, &c.Paused, &c.Rate.Limit, &periodMS, &c.Rate.Burst, &c.Shards, &c.Version, &c.UpdatedAt,
		&c.KeyConcurrency, &c.KeyThrottle, &windowMS)
	c.Rate.Period = time.Duration(periodMS) * time.Millisecond
	if c.KeyThrottle > 0 {
		c.KeyWindow = time.Duration(windowMS) * time.Millisecond
	}
	return c, err
}

// SetPaused pauses or resumes queue in Postgres (the truth; mirror it to Redis
// after the commit, with the controls returned). Pausing a paused queue still
// bumps the version: harmless.
func (s *Store) SetPaused(ctx context.Context, q Querier, queue string, paused bool) (QueueControl, error) {
	if err := validate.Queue(queue); err != nil {
		return QueueControl{}, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	c, err := scanQueueControl(q.QueryRow(ctx, `INSERT INTO `+s.queuesTable()+` AS t (queue, paused) VALUES ($1, $2)
ON CONFLICT (queue) DO UPDATE SET paused = $2, version = t.version + 1, updated_at = now()
RETURNING `+queueColumns, queue, paused))
	if err != nil {
		return QueueControl{}, fmt.Errorf("set paused %s: %w", queue, err)
	}
	return c, nil
}

// SetRateLimit sets queue's rate limit in Postgres (the truth; mirror it to
// Redis after the commit, with the controls returned). Limit 0 lifts it.
func (s *Store) SetRateLimit(ctx context.Context, q Querier, queue string, rate validate.RateLimit) (QueueControl, error) {
	if err := validate.Queue(queue); err != nil {
		return QueueControl{}, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	rate = rate.WithDefaults()
	if err := rate.Validate(); err != nil {
		return QueueControl{}, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	c, err := scanQueueControl(q.QueryRow(ctx, `INSERT INTO `+s.queuesTable()+` AS t (queue, rate_limit, rate_period_ms, rate_burst)
VALUES ($1, $2, $3, $4)
ON CONFLICT (queue) DO UPDATE SET rate_limit = $2, rate_period_ms = $3, rate_burst = $4,
	version = t.version + 1, updated_at = now()
RETURNING `+queueColumns, queue, rate.Limit, rate.Period.Milliseconds(), rate.Burst))
	if err != nil {
		return QueueControl{}, fmt.Errorf("set rate limit %s: %w", queue, err)
	}
	return c, nil
}

// SetKeyLimits sets queue's limits per concurrency key in Postgres (the truth;
// mirror them to Redis after the commit, with the controls returned):
// concurrency runs of one key at once, throttle starts of one key in any window
// (0: none; validate.KeyLimits).
func (s *Store) SetKeyLimits(ctx context.Context, q Querier, queue string, concurrency, throttle int, window time.Duration) (QueueControl, error) {
	if err := validate.Queue(queue); err != nil {
		return QueueControl{}, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if throttle == 0 {
		window = time.Second // no throttle: the column's default
	}
	if err := validate.KeyLimits(concurrency, throttle, window); err != nil {
		return QueueControl{}, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	c, err := scanQueueControl(q.QueryRow(ctx, `INSERT INTO `+s.queuesTable()+` AS t (queue, key_concurrency, key_throttle, key_window_ms)
VALUES ($1, $2, $3, $4)
ON CONFLICT (queue) DO UPDATE SET key_concurrency = $2, key_throttle = $3, key_window_ms = $4,
	version = t.version + 1, updated_at = now()
RETURNING `+queueColumns, queue, concurrency, throttle, window.Milliseconds()))
	if err != nil {
		return QueueControl{}, fmt.Errorf("set key limits %s: %w", queue, err)
	}
	return c, nil
}

// ErrQueueNotEmpty reports a shard count refused because the queue still has a
// pending, queued or dead task; nothing was written.
var ErrQueueNotEmpty = errors.New("queue not empty")

// SetShards sets queue's shard count in Postgres (the truth; mirror it to Redis
// after the commit, with the controls returned), bumping the version. A task
// keeps to the shard its id hashes to under the count it was moved with, so the
// count may change only while the queue has no task in Redis or on its way
// there: with a pending, queued or dead row of the queue, SetShards is
// ErrQueueNotEmpty and writes nothing. The check and the write are one statement
// (over the partial indexes of pending, queued and dead rows; the pending one is
// keyed by time, so the check of an empty queue reads all of it, as delayq stats
// does: 8-15 ms for 50,000 pending rows), and concurrent calls take the queue's
// row lock in turn, so their versions order them. A producer's enqueue takes no
// such lock: one that commits during the call is not seen, so stop the queue's
// producers around a change to be sure.
//
// Setting the count the queue has already is a success that bumps nothing and
// checks nothing (the controls are returned as they are: mirroring them again
// repairs a Redis that lost them).
func (s *Store) SetShards(ctx context.Context, q Querier, queue string, shards int) (QueueControl, error) {
	if err := validate.Queue(queue); err != nil {
		return QueueControl{}, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if err := validate.Shards(shards); err != nil {
		return QueueControl{}, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	c, err := scanQueueControl(q.QueryRow(ctx, s.setShardsSQL(), queue, shards))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return QueueControl{}, fmt.Errorf("set shards %s to %d: %w: it has pending, queued or dead tasks", queue, shards, ErrQueueNotEmpty)
	case err != nil:
		return QueueControl{}, fmt.Errorf("set shards %s: %w", queue, err)
	}
	return c, nil
}

// setShardsSQL is SetShards's statement: $1 queue, $2 shards.
func (s *Store) setShardsSQL() string {
	// The row is proposed unless the queue is busy and has no row (a missing row
	// is 1 shard); an existing row is updated only to the same count (no bump) or
	// while the queue is not busy. No row back: refused.
	//
	// Queued and dead rows are found by their indexes keyed by queue, at once. The
	// pending index is keyed by time: OFFSET 0 keeps the planner to reading it
	// (index only), as delayq stats does, rather than guessing from statistics of
	// (queue, state) that an empty queue has pending rows and scanning the table.
	return `WITH busy AS (
	SELECT EXISTS (SELECT 1 FROM ` + s.Table() + ` WHERE queue = $1 AND state = 'queued')
		OR EXISTS (SELECT 1 FROM ` + s.Table() + ` WHERE queue = $1 AND state = 'dead')
		OR EXISTS (SELECT 1 FROM (SELECT queue FROM ` + s.Table() + ` WHERE state = 'pending' OFFSET 0) AS p
			WHERE p.queue = $1) AS b
)
INSERT INTO ` + s.queuesTable() + ` AS t (queue, shards)
SELECT $1, $2 FROM busy
WHERE NOT busy.b OR $2 = 1 OR EXISTS (SELECT 1 FROM ` + s.queuesTable() + ` WHERE queue = $1)
ON CONFLICT (queue) DO UPDATE SET shards = excluded.shards,
	version = t.version + CASE WHEN t.shards = excluded.shards THEN 0 ELSE 1 END,
	updated_at = CASE WHEN t.shards = excluded.shards THEN t.updated_at ELSE now() END
WHERE t.shards = excluded.shards OR NOT (SELECT b FROM busy)
RETURNING ` + queueColumns
}

// QueueControls reads the controls of every queue that has a row, by name.
func (s *Store) QueueControls(ctx context.Context, q Querier) ([]QueueControl, error) {
	rows, err := q.Query(ctx, `SELECT `+queueColumns+` FROM `+s.queuesTable()+` ORDER BY queue`)
	if err != nil {
		return nil, fmt.Errorf("read queue controls: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (QueueControl, error) { return scanQueueControl(r) })
	if err != nil {
		return nil, fmt.Errorf("read queue controls: %w", err)
	}
	return out, nil
}

// QueueShards reads queue's shard count: 1 when the queue has no controls row. The
// repairs route by it (reconcile, the relay's self-healing), as the relay's round
// routes by the count TakeDue returns.
func (s *Store) QueueShards(ctx context.Context, q Querier, queue string) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COALESCE((SELECT shards FROM `+s.queuesTable()+` WHERE queue = $1), 1)`, queue).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("read shard count of %s: %w", queue, err)
	}
	return n, nil
}
