package taskstate

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/validate"
)

// QueuesTableName is the table of per-queue controls, created by package
// migrations (00004): whether a queue is paused, its rate limit, and the version
// of its controls, which the Redis mirror (dq:{queue}:ctl) is keyed by.
const QueuesTableName = "delayq_queues"

// QueueControl is one queue's row of the controls table.
type QueueControl struct {
	Queue  string `json:"queue"`
	Paused bool   `json:"paused"`
	// Rate caps the queue's starts across every worker (Limit 0: none).
	Rate validate.RateLimit `json:"rate_limit"`
	// Version is bumped by every change; Redis applies a control only over an
	// older version.
	Version   int64     `json:"version"`
	UpdatedAt time.Time `json:"updated_at"`
}

func (s *Store) queuesTable() string {
	return fmt.Sprintf(`"%s".%s`, s.cfg.Schema, QueuesTableName)
}

const queueColumns = `queue, paused, rate_limit, rate_period_ms, rate_burst, version, updated_at`

func scanQueueControl(r pgx.Row) (QueueControl, error) {
	var c QueueControl
	var periodMS int64
	err := r.Scan(&c.Queue, &c.Paused, &c.Rate.Limit, &periodMS, &c.Rate.Burst, &c.Version, &c.UpdatedAt)
	c.Rate.Period = time.Duration(periodMS) * time.Millisecond
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
