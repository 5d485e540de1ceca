package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
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
	rows, err := db.Query(ctx, st.listDead, nonNil(o.Queues), limit)
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

// RetryDead gives the dead task queue/id a new life: in one transaction its outbox
// row becomes queued again with attempt 0 and run time now (its version and last
// error stay), and Redis gets the task ready now with its runs reset, whatever Redis
// held for it (delayq's RequeueDead, also when Redis lost the task). It returns an
// error wrapping ErrNotFound (no row) or ErrNotDead.
func RetryDead(ctx context.Context, db DB, dq *delayq.Client, opts Options, queue, id string) error {
	if err := errors.Join(validate.Queue(queue), validate.TaskID(id)); err != nil {
		return fmt.Errorf("reconcile: retry dead: %w", err)
	}
	opts.Queues = []string{queue}
	n, err := deadBatches(ctx, db, dq, opts, true, []string{id})
	if err != nil || n == 1 {
		return err
	}
	return explainNotDead(ctx, db, opts, "retry", queue, id)
}

// RetryAllDead is RetryDead for every dead task of Options.Queues (nil: all
// queues), in batches of Options.BatchSize. It returns how many it retried.
func RetryAllDead(ctx context.Context, db DB, dq *delayq.Client, opts Options) (int, error) {
	return deadBatches(ctx, db, dq, opts, true, nil)
}

// PurgeDead deletes every dead task of Options.Queues (nil: all queues) from the
// outbox and from Redis, in batches of Options.BatchSize, and returns how many.
// Their ids become free: an enqueue of the same id is a new task.
func PurgeDead(ctx context.Context, db DB, dq *delayq.Client, opts Options) (int, error) {
	return deadBatches(ctx, db, dq, opts, false, nil)
}

// PurgeDeadTask deletes the dead task queue/id from both stores. It returns an
// error wrapping ErrNotFound (no row) or ErrNotDead.
func PurgeDeadTask(ctx context.Context, db DB, dq *delayq.Client, opts Options, queue, id string) error {
	if err := errors.Join(validate.Queue(queue), validate.TaskID(id)); err != nil {
		return fmt.Errorf("reconcile: purge dead: %w", err)
	}
	opts.Queues = []string{queue}
	n, err := deadBatches(ctx, db, dq, opts, false, []string{id})
	if err != nil || n == 1 {
		return err
	}
	return explainNotDead(ctx, db, opts, "purge", queue, id)
}

func explainNotDead(ctx context.Context, db DB, opts Options, op, queue, id string) error {
	_, st, err := opts.prepare()
	if err != nil {
		return err
	}
	var state string
	err = db.QueryRow(ctx, fmt.Sprintf("SELECT state FROM (%s) AS r", st.lookup), queue, []string{id}).Scan(&state)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("reconcile: %s dead %s/%s: %w", op, queue, id, ErrNotFound)
	case err != nil:
		return fmt.Errorf("reconcile: %s dead %s/%s: %w", op, queue, id, err)
	case state == stateDead:
		return fmt.Errorf("reconcile: %s dead %s/%s: the row is locked by another transaction; try again", op, queue, id)
	}
	return fmt.Errorf("reconcile: %s dead %s/%s: %w (state %s)", op, queue, id, ErrNotDead, state)
}

// deadBatches retries (retry) or purges the dead rows of opts.Queues, only ids when
// given, a batch per transaction; Redis is rewritten while the rows are locked.
func deadBatches(ctx context.Context, db DB, dq *delayq.Client, opts Options, retry bool, ids []string) (int, error) {
	if db == nil || dq == nil {
		return 0, fmt.Errorf("%w: nil database or Redis client", ErrInvalidOptions)
	}
	o, st, err := opts.prepare()
	if err != nil {
		return 0, err
	}
	sql, what := st.purgeDead, "purge dead"
	if retry {
		sql, what = st.retryDead, "retry dead"
	}
	total := 0
	for {
		n, err := func() (int, error) {
			tx, err := db.Begin(ctx)
			if err != nil {
				return 0, err
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			rows, err := tx.Query(ctx, sql, nonNil(o.Queues), nonNil(ids), o.BatchSize)
			if err != nil {
				return 0, err
			}
			byQueue := map[string][]delayq.Task{}
			var order []string
			n := 0
			var q string
			var t delayq.Task
			var runAt time.Time
			scan := []any{&q, &t.ID}
			if retry {
				scan = append(scan, &t.Version, &t.MaxAttempts, &t.Payload, &runAt)
			}
			_, err = pgx.ForEachRow(rows, scan, func() error {
				if _, ok := byQueue[q]; !ok {
					order = append(order, q)
				}
				// RunAt stays zero: ready now by the Redis clock.
				byQueue[q] = append(byQueue[q], delayq.Task{ID: t.ID, Payload: t.Payload,
					MaxAttempts: t.MaxAttempts, Version: t.Version})
				n++
				return nil
			})
			if err != nil {
				return 0, err
			}
			for _, q := range order {
				op := delayq.RepairRemove
				if retry {
					op = delayq.RepairRestore
				}
				if err := forceRepair(ctx, dq, q, op, byQueue[q]); err != nil {
					return 0, err
				}
			}
			return n, tx.Commit(ctx)
		}()
		if err != nil {
			return total, fmt.Errorf("reconcile: %s: %w", what, err)
		}
		total += n
		if n < o.BatchSize || ids != nil {
			return total, nil
		}
	}
}

// forceRepair applies op to every task whatever Redis holds for it, probing again
// the few that change between the probe and the repair.
func forceRepair(ctx context.Context, dq *delayq.Client, q string, op delayq.RepairOp, tasks []delayq.Task) error {
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
			repairs := make([]delayq.Repair, len(todo))
			for i, t := range todo {
				repairs[i] = delayq.Repair{Op: op, ID: t.ID, Fingerprint: probes[i].Fingerprint, Task: t}
			}
			applied, err := dq.RepairIf(ctx, q, repairs...)
			if err != nil {
				return err
			}
			var again []delayq.Task
			for i, ok := range applied {
				if !ok {
					again = append(again, todo[i])
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
