package reconcile

import (
	"context"
	"errors"
	"fmt"
	"github.com/delayq/delayq/delayqtype"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/transition"
	"github.com/delayq/delayq/internal/validate"
)

type DeadTask = delayqtype.DeadTask

// ListDead lists up to limit dead tasks of Options.Queues (nil: all queues), the
// most recent deaths first. Postgres is the record: the list comes from the outbox.
func ListDead(ctx context.Context, db DB, opts Options, limit int) ([]DeadTask, error) {
	o, st, err := opts.prepare()
	if err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("%w: limit %d: at least 1", ErrInvalidOptions, limit)
	}
	rows, err := db.Query(ctx, st.ListDead, nonNil(o.Queues), limit)
	if err != nil {
		return nil, fmt.Errorf("reconcile: list dead: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadTask, error) {
		var d DeadTask
		var died *time.Time
		err := r.Scan(&d.Queue, &d.ID, &d.Attempts, &d.MaxAttempts, &d.LastError, &died, &d.Version)
		if died != nil {
			d.DiedAt = *died
		}
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("reconcile: list dead: %w", err)
	}
	return out, nil
}

// RetryDead gives the dead task queue/id a new life: its outbox row becomes pending
// again as a new version, due now, with attempt 0 (its last error stays until the
// next run). Postgres alone, in one statement that notifies the relay at commit: the
// relay moves the new version, and its enqueue replaces the dead record of the older
// one in Redis (or finds none, after a Redis loss). It returns an error wrapping
// ErrNotFound (no row) or ErrNotDead.
func RetryDead(ctx context.Context, db DB, opts Options, queue, id string) error {
	if err := errors.Join(validate.Queue(queue), validate.TaskID(id)); err != nil {
		return fmt.Errorf("reconcile: retry dead: %w", err)
	}
	opts.Queues = []string{queue}
	n, err := retryDead(ctx, db, opts, []string{id})
	if err != nil || n == 1 {
		return err
	}
	return explainNotDead(ctx, db, opts, "retry", queue, id)
}

// RetryAllDead is RetryDead for every dead task of Options.Queues (nil: all
// queues), in batches of Options.BatchSize. It returns how many it retried.
func RetryAllDead(ctx context.Context, db DB, opts Options) (int, error) {
	return retryDead(ctx, db, opts, nil)
}

// PurgeDead deletes every dead task of Options.Queues (nil: all queues) from the
// outbox, then from Redis, in batches of Options.BatchSize, and returns how many.
// Their ids become free: an enqueue of the same id is a new task. A row whose
// queue or id could never be a Redis key (written by hand, or by an older version)
// is deleted from the outbox and logged; it has nothing in Redis to remove.
func PurgeDead(ctx context.Context, db DB, dq *dispatch.Client, opts Options) (int, error) {
	return purgeDead(ctx, db, dq, opts, nil)
}

// PurgeDeadTask deletes the dead task queue/id from both stores. It returns an
// error wrapping ErrNotFound (no row) or ErrNotDead.
func PurgeDeadTask(ctx context.Context, db DB, dq *dispatch.Client, opts Options, queue, id string) error {
	if err := errors.Join(validate.Queue(queue), validate.TaskID(id)); err != nil {
		return fmt.Errorf("reconcile: purge dead: %w", err)
	}
	opts.Queues = []string{queue}
	n, err := purgeDead(ctx, db, dq, opts, []string{id})
	if err != nil || n == 1 {
		return err
	}
	return explainNotDead(ctx, db, opts, "purge", queue, id)
}

func explainNotDead(ctx context.Context, db DB, opts Options, op, queue, id string) error {
	o, _, err := opts.prepare()
	if err != nil {
		return err
	}
	row, err := taskstate.New(taskstate.Config{Schema: o.Schema}).Row(ctx, db, queue, id)
	switch {
	case err != nil:
		return fmt.Errorf("reconcile: %s dead %s/%s: %w", op, queue, id, err)
	case !row.Exists:
		return fmt.Errorf("reconcile: %s dead %s/%s: %w", op, queue, id, ErrNotFound)
	case row.State == taskstate.Dead:
		return fmt.Errorf("reconcile: %s dead %s/%s: the row is locked by another transaction; try again", op, queue, id)
	}
	return fmt.Errorf("reconcile: %s dead %s/%s: %w (state %s)", op, queue, id, ErrNotDead, row.State)
}

// retryDead retries the dead rows of opts.Queues (only ids, when given), a batch
// per statement.
func retryDead(ctx context.Context, db DB, opts Options, ids []string) (int, error) {
	if db == nil {
		return 0, fmt.Errorf("%w: nil database", ErrInvalidOptions)
	}
	o, _, err := opts.prepare()
	if err != nil {
		return 0, err
	}
	ops := o.ops(nil)
	total := 0
	for {
		n, err := ops.RetryDead(ctx, db, o.Queues, ids, o.BatchSize)
		if err != nil {
			return total, fmt.Errorf("reconcile: retry dead: %w", err)
		}
		total += n
		if n < o.BatchSize || ids != nil {
			return total, nil
		}
	}
}

// purgeDead deletes the dead rows of opts.Queues (only ids, when given), a batch
// per statement, each batch committed before its Redis records are removed.
func purgeDead(ctx context.Context, db DB, dq *dispatch.Client, opts Options, ids []string) (int, error) {
	if db == nil || dq == nil {
		return 0, fmt.Errorf("%w: nil database or Redis client", ErrInvalidOptions)
	}
	o, _, err := opts.prepare()
	if err != nil {
		return 0, err
	}
	ops := o.ops(dq)
	total := 0
	for {
		res, err := ops.PurgeDead(ctx, db, o.Queues, ids, o.BatchSize)
		total += res.Deleted
		for _, key := range res.Unkeyed {
			// A queue or id Redis cannot hold has nothing there.
			o.Logger.Warn("reconcile: purged a dead row whose key Redis cannot hold", "task", key)
		}
		var se *transition.StepError
		switch {
		case errors.As(err, &se):
			return total, fmt.Errorf("reconcile: purge dead: rows deleted, Redis not cleaned (check and reconcile repair it): %w", se.Err)
		case err != nil:
			return total, fmt.Errorf("reconcile: purge dead: %w", err)
		}
		if res.Deleted < o.BatchSize || ids != nil {
			return total, nil
		}
	}
}

// nonNil turns nil into an empty slice: pgx sends nil as NULL, not as an empty array.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
