package taskstate

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/validate"
)

// QueuesTableName is the table of per-queue controls, created by package
// migrations (00004): whether a queue is paused, and the version of its controls,
// which the Redis mirror (dq:{queue}:ctl) is keyed by.
const QueuesTableName = "delayq_queues"

// QueueControl is one queue's row of the controls table.
type QueueControl struct {
	Queue  string `json:"queue"`
	Paused bool   `json:"paused"`
	// Version is bumped by every change; Redis applies a control only over an
	// older version.
	Version   int64     `json:"version"`
	UpdatedAt time.Time `json:"updated_at"`
}

func (s *Store) queuesTable() string {
	return fmt.Sprintf(`"%s".%s`, s.cfg.Schema, QueuesTableName)
}

// SetPaused pauses or resumes queue in Postgres (the truth; mirror it to Redis
// after the commit, with the version returned) and returns the controls' new
// version. Pausing a paused queue still bumps the version: harmless.
func (s *Store) SetPaused(ctx context.Context, q Querier, queue string, paused bool) (int64, error) {
	if err := validate.Queue(queue); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	var v int64
	err := q.QueryRow(ctx, `INSERT INTO `+s.queuesTable()+` AS t (queue, paused) VALUES ($1, $2)
ON CONFLICT (queue) DO UPDATE SET paused = $2, version = t.version + 1, updated_at = now()
RETURNING version`, queue, paused).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("set paused %s: %w", queue, err)
	}
	return v, nil
}

// QueueControls reads the controls of every queue that has a row, by name.
func (s *Store) QueueControls(ctx context.Context, q Querier) ([]QueueControl, error) {
	rows, err := q.Query(ctx, `SELECT queue, paused, version, updated_at FROM `+s.queuesTable()+` ORDER BY queue`)
	if err != nil {
		return nil, fmt.Errorf("read queue controls: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (QueueControl, error) {
		var c QueueControl
		err := r.Scan(&c.Queue, &c.Paused, &c.Version, &c.UpdatedAt)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("read queue controls: %w", err)
	}
	return out, nil
}
