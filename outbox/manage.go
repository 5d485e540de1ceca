package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/notmigrated"
	"github.com/delayq/delayq/internal/validate"
)

// Cancel moves a task that has not finished (pending or queued) to cancelled. A worker
// that runs it nevertheless cannot complete it (its guard fails), and the relay's
// reconcile removes it from Redis. It returns an error wrapping ErrNotFound or
// ErrFinished when there is nothing to cancel.
func (c *Client) Cancel(ctx context.Context, q Querier, queue, id string) error {
	return notmigrated.Classify(c.cancel(ctx, q, queue, id))
}

func (c *Client) cancel(ctx context.Context, q Querier, queue, id string) error {
	if err := checkKey(queue, id); err != nil {
		return fmt.Errorf("outbox: cancel: %w", err)
	}
	ok, err := c.ops.Cancel(ctx, q, queue, id)
	if err != nil {
		return fmt.Errorf("outbox: cancel %s/%s: %w", queue, id, err)
	}
	if !ok {
		return c.explain(ctx, q, "cancel", queue, id)
	}
	return nil
}

// Reschedule moves a task that has not finished (pending or queued) to runAt, as a new
// version: the relay puts it in Redis again in place of the old one, and a worker running
// the old version cannot complete it. Its attempts so far are kept. The relay is notified
// at commit. It returns an error wrapping ErrInvalidTask for a runAt that is zero, at
// or before the Unix epoch or after the year 9999, or ErrNotFound or ErrFinished.
func (c *Client) Reschedule(ctx context.Context, q Querier, queue, id string, runAt time.Time) error {
	return notmigrated.Classify(c.reschedule(ctx, q, queue, id, runAt))
}

func (c *Client) reschedule(ctx context.Context, q Querier, queue, id string, runAt time.Time) error {
	if err := checkKey(queue, id); err != nil {
		return fmt.Errorf("outbox: reschedule: %w", err)
	}
	if err := checkRunAt(runAt); err != nil {
		return fmt.Errorf("outbox: reschedule %s/%s: %w", queue, id, err)
	}
	updated, err := c.ops.Reschedule(ctx, q, queue, id, runAt)
	if err != nil {
		return fmt.Errorf("outbox: reschedule %s/%s: %w", queue, id, err)
	}
	if updated {
		return nil
	}
	// Refused: the row is gone or finished, or its start deadline comes before
	// the new run time or has passed (by the statement's clock: a second of
	// slack for this one's).
	row, err := c.store.Row(ctx, q, queue, id)
	if err == nil && row.Exists && row.State.Live() && !row.StartBy.IsZero() {
		if row.StartBy.Before(runAt) || row.StartBy.Before(time.Now().Add(time.Second)) {
			return fmt.Errorf("outbox: reschedule %s/%s: %w: the task's deadline %s is before the new run time %s: it could never start; nothing changed",
				queue, id, validate.ErrInvalidStartBy, row.StartBy.UTC().Format(time.RFC3339Nano), runAt.UTC().Format(time.RFC3339Nano))
		}
	}
	return c.explain(ctx, q, "reschedule", queue, id)
}

// RetryDeadEdited retries the dead task queue/id with a new payload: its row
// becomes pending as a new version, due now, attempts reset, its payload replaced
// (checked against Config.MaxPayloadBytes like an enqueue's), and the relay moves
// it (notified at commit). version is the dead version the edit was made on: if
// the row is no longer that version, or no longer dead, nothing changes and the
// error wraps ErrStale (or ErrNotFound when there is no row). Postgres alone, in
// the caller's transaction: the transition dead-edit-retry of docs/DESIGN.md.
// It returns the new version.
func (c *Client) RetryDeadEdited(ctx context.Context, q Querier, queue, id string, version int, payload []byte) (int, error) {
	v, err := c.retryDeadEdited(ctx, q, queue, id, version, payload)
	return v, notmigrated.Classify(err)
}

func (c *Client) retryDeadEdited(ctx context.Context, q Querier, queue, id string, version int, payload []byte) (int, error) {
	if err := checkKey(queue, id); err != nil {
		return 0, fmt.Errorf("outbox: retry edited: %w", err)
	}
	if version < 1 || version > validate.MaxVersion {
		return 0, fmt.Errorf("outbox: retry edited %s/%s: %w: version %d: 1..%d", queue, id, ErrInvalidConfig, version, validate.MaxVersion)
	}
	if limit := c.cfg.MaxPayloadBytes; len(payload) > limit {
		return 0, fmt.Errorf("outbox: retry edited %s/%s: %w: %d bytes, at most %d (Config.MaxPayloadBytes)", queue, id, ErrPayloadTooLarge, len(payload), limit)
	}
	if payload == nil {
		payload = []byte{} // the column is NOT NULL: an empty payload is a payload
	}
	next, err := c.ops.RetryDeadEdited(ctx, q, queue, id, version, payload)
	if err != nil {
		return 0, fmt.Errorf("outbox: retry edited %s/%s: %w", queue, id, err)
	}
	if next == 0 {
		row, err := c.store.Row(ctx, q, queue, id)
		switch {
		case err != nil:
			return 0, fmt.Errorf("outbox: retry edited %s/%s: %w", queue, id, err)
		case !row.Exists:
			return 0, fmt.Errorf("outbox: retry edited %s/%s: %w", queue, id, ErrNotFound)
		}
		return 0, fmt.Errorf("outbox: retry edited %s/%s: %w: edited version %d, the row is %s version %d",
			queue, id, ErrStale, version, row.State, row.Version)
	}
	return next, nil
}

// explain tells why a guarded update of queue/id changed no row.
func (c *Client) explain(ctx context.Context, q Querier, op, queue, id string) error {
	row, err := c.store.Row(ctx, q, queue, id)
	switch {
	case err != nil:
		return fmt.Errorf("outbox: %s %s/%s: %w", op, queue, id, err)
	case !row.Exists:
		return fmt.Errorf("outbox: %s %s/%s: %w", op, queue, id, ErrNotFound)
	case row.State.Live() || row.State == delayqtype.StateWaiting:
		// Our update did not see the row, this later statement does: it was committed
		// in between (possible under READ COMMITTED).
		return fmt.Errorf("outbox: %s %s/%s: the task changed concurrently; try again", op, queue, id)
	default:
		return fmt.Errorf("outbox: %s %s/%s: %w (state %s)", op, queue, id, ErrFinished, row.State)
	}
}

func checkKey(queue, id string) error {
	return errors.Join(validate.Queue(queue), validate.TaskID(id))
}
