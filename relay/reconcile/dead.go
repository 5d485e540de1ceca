package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
)

// DeadTask is a dead outbox row: a task that used its attempts (or was killed)
// and waits for a person.
type DeadTask struct {
	Queue       string `json:"queue"`
	ID          string `json:"id"`
	Attempts    int    `json:"attempts"`
	MaxAttempts int    `json:"max_attempts"`
	LastError   string `json:"last_error"`
	// DiedAt is when the row became dead (zero if not recorded).
	DiedAt  time.Time `json:"died_at"`
	Version int       `json:"version"`
}

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
func PurgeDead(ctx context.Context, db DB, dq *delayq.Client, opts Options) (int, error) {
	return purgeDead(ctx, db, dq, opts, nil)
}

// PurgeDeadTask deletes the dead task queue/id from both stores. It returns an
// error wrapping ErrNotFound (no row) or ErrNotDead.
func PurgeDeadTask(ctx context.Context, db DB, dq *delayq.Client, opts Options, queue, id string) error {
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
	o, st, err := opts.prepare()
	if err != nil {
		return 0, err
	}
	total := 0
	for {
		rows, err := db.Query(ctx, st.RetryDead, nonNil(o.Queues), nonNil(ids), o.BatchSize)
		if err != nil {
			return total, fmt.Errorf("reconcile: retry dead: %w", err)
		}
		var q, id string
		var notified int64
		tag, err := pgx.ForEachRow(rows, []any{&q, &id, &notified}, func() error { return nil })
		if err != nil {
			return total, fmt.Errorf("reconcile: retry dead: %w", err)
		}
		n := int(tag.RowsAffected())
		total += n
		if n < o.BatchSize || ids != nil {
			return total, nil
		}
	}
}

// purgeDead deletes the dead rows of opts.Queues (only ids, when given), a batch
// per statement, each batch committed before its Redis records are removed.
func purgeDead(ctx context.Context, db DB, dq *delayq.Client, opts Options, ids []string) (int, error) {
	if db == nil || dq == nil {
		return 0, fmt.Errorf("%w: nil database or Redis client", ErrInvalidOptions)
	}
	o, st, err := opts.prepare()
	if err != nil {
		return 0, err
	}
	total := 0
	for {
		rows, err := db.Query(ctx, st.PurgeDead, nonNil(o.Queues), nonNil(ids), o.BatchSize)
		if err != nil {
			return total, fmt.Errorf("reconcile: purge dead: %w", err)
		}
		byQueue := map[string][]delayq.Task{}
		var order []string
		var q string
		var t delayq.Task
		tag, err := pgx.ForEachRow(rows, []any{&q, &t.ID, &t.Version}, func() error {
			if _, ok := byQueue[q]; !ok {
				order = append(order, q)
			}
			byQueue[q] = append(byQueue[q], delayq.Task{ID: t.ID, Version: t.Version})
			return nil
		})
		if err != nil {
			return total, fmt.Errorf("reconcile: purge dead: %w", err)
		}
		n := int(tag.RowsAffected())
		total += n
		// Committed: now Redis, queue by queue. A queue or id Redis cannot hold
		// has nothing there; it is logged and the others go on.
		for _, q := range order {
			tasks := byQueue[q]
			if err := validate.Queue(q); err != nil {
				o.Logger.Warn("reconcile: purged dead rows of a queue Redis cannot hold", "queue", q, "rows", len(tasks), "err", err)
				continue
			}
			valid := tasks[:0]
			for _, t := range tasks {
				if err := validate.TaskID(t.ID); err != nil {
					o.Logger.Warn("reconcile: purged a dead row whose id Redis cannot hold", "queue", q, "err", err)
					continue
				}
				valid = append(valid, t)
			}
			if err := removeVersions(ctx, dq, q, valid); err != nil {
				return total, fmt.Errorf("reconcile: purge dead: rows deleted, Redis not cleaned (check and reconcile repair it): %w", err)
			}
		}
		if n < o.BatchSize || ids != nil {
			return total, nil
		}
	}
}

// removeVersions removes from Redis what it holds of each task at the task's version
// or an older one, probing again the few that change between the probe and the
// removal; a newer version (the id enqueued again meanwhile) is left alone.
func removeVersions(ctx context.Context, dq *delayq.Client, q string, tasks []delayq.Task) error {
	for start := 0; start < len(tasks); start += 1000 {
		todo := tasks[start:min(start+1000, len(tasks))]
		for round := 0; len(todo) > 0; round++ {
			if round == 10 {
				return fmt.Errorf("%s/%s keeps changing in Redis; try again", q, todo[0].ID)
			}
			ids := make([]string, len(todo))
			for i, t := range todo {
				ids[i] = t.ID
			}
			_, probes, err := dq.Probe(ctx, q, ids...)
			if err != nil {
				return err
			}
			var repairs []delayq.Repair
			var asked []delayq.Task
			for i, t := range todo {
				p := probes[i]
				if p.State == delayq.StateMissing && !p.InReady && !p.InActive && !p.InDead || p.Version > t.Version {
					continue
				}
				repairs = append(repairs, delayq.Repair{Op: delayq.RepairRemove, ID: t.ID, Fingerprint: p.Fingerprint})
				asked = append(asked, t)
			}
			if len(repairs) == 0 {
				break
			}
			applied, err := dq.RepairIf(ctx, q, repairs...)
			if err != nil {
				return err
			}
			var again []delayq.Task
			for i, ok := range applied {
				if !ok {
					again = append(again, asked[i])
				}
			}
			todo = again
		}
	}
	return nil
}

// nonNil turns nil into an empty slice: pgx sends nil as NULL, not as an empty array.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
