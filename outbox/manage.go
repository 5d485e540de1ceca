package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delayq/delayq/internal/validate"
)

// Cancel moves a task that has not finished (pending or queued) to cancelled. A worker
// that runs it nevertheless cannot complete it (its guard fails), and the relay's
// reconcile removes it from Redis. It returns an error wrapping ErrNotFound or
// ErrFinished when there is nothing to cancel.
func (c *Client) Cancel(ctx context.Context, q Querier, queue, id string) error {
	if err := checkKey(queue, id); err != nil {
		return fmt.Errorf("outbox: cancel: %w", err)
	}
	n, err := pgxRunner{q}.exec(ctx, c.sql.cancel, []any{queue, id})
	if err != nil {
		return fmt.Errorf("outbox: cancel %s/%s: %w", queue, id, err)
	}
	if n == 0 {
		return c.explain(ctx, pgxRunner{q}, "cancel", queue, id)
	}
	return nil
}

// Reschedule moves a task that has not finished (pending or queued) to runAt, as a new
// version: the relay puts it in Redis again in place of the old one, and a worker running
// the old version cannot complete it. Its attempts so far are kept. The relay is notified
// at commit. It returns an error wrapping ErrInvalidRunAt for a runAt that is zero, at
// or before the Unix epoch or after the year 9999, or ErrNotFound or ErrFinished.
func (c *Client) Reschedule(ctx context.Context, q Querier, queue, id string, runAt time.Time) error {
	if err := checkKey(queue, id); err != nil {
		return fmt.Errorf("outbox: reschedule: %w", err)
	}
	if err := checkRunAt(runAt); err != nil {
		return fmt.Errorf("outbox: reschedule %s/%s: %w", queue, id, err)
	}
	updated := false
	err := pgxRunner{q}.query(ctx, c.sql.reschedule, []any{queue, id, runAt}, func(scan func(...any) error) error {
		var version, notified int64
		updated = true
		return scan(&version, &notified)
	})
	if err != nil {
		return fmt.Errorf("outbox: reschedule %s/%s: %w", queue, id, err)
	}
	if !updated {
		return c.explain(ctx, pgxRunner{q}, "reschedule", queue, id)
	}
	return nil
}

// explain tells why a guarded update of queue/id changed no row.
func (c *Client) explain(ctx context.Context, r runner, op, queue, id string) error {
	state := ""
	err := r.query(ctx, c.sql.state, []any{queue, id}, func(scan func(...any) error) error {
		return scan(&state)
	})
	switch {
	case err != nil:
		return fmt.Errorf("outbox: %s %s/%s: %w", op, queue, id, err)
	case state == "":
		return fmt.Errorf("outbox: %s %s/%s: %w", op, queue, id, ErrNotFound)
	case state == "pending" || state == "queued":
		// Our update did not see the row, this later statement does: it was committed
		// in between (possible under READ COMMITTED).
		return fmt.Errorf("outbox: %s %s/%s: the task changed concurrently; try again", op, queue, id)
	default:
		return fmt.Errorf("outbox: %s %s/%s: %w (state %s)", op, queue, id, ErrFinished, state)
	}
}

// MarkDone is the worker's completion guard: it marks the task done if, and only if, it
// is still pending or queued at this version. Run it in the transaction of the handler's
// own writes. applied false means someone else finished the task, or it was cancelled
// or rescheduled: roll back, so the effect is not applied twice.
func (c *Client) MarkDone(ctx context.Context, q Querier, queue, id string, version int) (applied bool, err error) {
	if err := checkGuard(queue, id, version); err != nil {
		return false, fmt.Errorf("outbox: mark done: %w", err)
	}
	n, err := pgxRunner{q}.exec(ctx, c.sql.markDone, []any{queue, id, int32(version)})
	if err != nil {
		return false, fmt.Errorf("outbox: mark done %s/%s: %w", queue, id, err)
	}
	return n == 1, nil
}

// TaskKey names one version of a task, for MarkDoneMany.
type TaskKey struct {
	Queue, ID string
	Version   int
}

// MarkDoneMany is MarkDone for many tasks in one statement (one commit, when q is a
// pool): applied[i] tells whether keys[i] was marked done. Workers use it to record
// the completions of plain handlers in batches.
func (c *Client) MarkDoneMany(ctx context.Context, q Querier, keys []TaskKey) (applied []bool, err error) {
	queues, ids, versions := make([]string, len(keys)), make([]string, len(keys)), make([]int32, len(keys))
	index := make(map[[2]string]int, len(keys))
	for i, k := range keys {
		if err := checkGuard(k.Queue, k.ID, k.Version); err != nil {
			return nil, fmt.Errorf("outbox: mark done: %w", err)
		}
		queues[i], ids[i], versions[i] = k.Queue, k.ID, int32(k.Version)
		index[[2]string{k.Queue, k.ID}] = i
	}
	applied = make([]bool, len(keys))
	err = pgxRunner{q}.query(ctx, c.sql.markDoneMany, []any{queues, ids, versions}, func(scan func(...any) error) error {
		var queue, id string
		if err := scan(&queue, &id); err != nil {
			return err
		}
		applied[index[[2]string{queue, id}]] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: mark done (%d tasks): %w", len(keys), err)
	}
	return applied, nil
}

// RecordFailure records a failed attempt of the task at this version: its attempt number
// and lastErr, cut to a summary of at most MaxErrorBytes bytes; with dead, the task
// becomes dead (terminal; it waits for a person). Like MarkDone it changes nothing, and
// returns false, unless the task is still pending or queued at this version.
func (c *Client) RecordFailure(ctx context.Context, q Querier, queue, id string, version, attempt int,
	lastErr string, dead bool,
) (applied bool, err error) {
	if err := checkGuard(queue, id, version); err != nil {
		return false, fmt.Errorf("outbox: record failure: %w", err)
	}
	if attempt < 0 || attempt > maxInt32 {
		return false, fmt.Errorf("outbox: record failure: %w: attempt %d", ErrInvalidConfig, attempt)
	}
	n, err := pgxRunner{q}.exec(ctx, c.sql.recordFailure,
		[]any{queue, id, int32(version), int32(attempt), errorSummary(lastErr), dead})
	if err != nil {
		return false, fmt.Errorf("outbox: record failure %s/%s: %w", queue, id, err)
	}
	return n == 1, nil
}

func checkKey(queue, id string) error {
	return errors.Join(validate.Queue(queue), validate.TaskID(id))
}

func checkGuard(queue, id string, version int) error {
	if err := checkKey(queue, id); err != nil {
		return err
	}
	if version < 1 || version > maxInt32 {
		return fmt.Errorf("%w: version %d", ErrInvalidConfig, version)
	}
	return nil
}
