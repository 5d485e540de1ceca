package delayq

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/outbox"
)

// Register registers a plain handler for the typed queue q: it gets the task's
// payload decoded into a T by q's codec (JSON by default). A payload that does
// not decode never will: the task is dead at once, its last error saying why
// (an error wrapping outbox.ErrInvalidPayload, in NoRetry). See Handle.
func Register[T any](c *Client, q outbox.Queue[T], h func(ctx context.Context, t *Task, v T) error, cfg QueueConfig) error {
	if h == nil {
		return fmt.Errorf("%w: nil handler for queue %q", ErrInvalidConfig, q.Name)
	}
	if err := bindQueue(c, q); err != nil {
		return err
	}
	return c.w.Handle(q.Name, func(ctx context.Context, t *Task) error {
		v, err := decode(q, t)
		if err != nil {
			return err
		}
		return h(ctx, t, v)
	}, cfg)
}

// RegisterTx registers a transactional handler for the typed queue q (see
// Register and HandleTx).
func RegisterTx[T any](c *Client, q outbox.Queue[T], h func(ctx context.Context, tx pgx.Tx, t *Task, v T) error, cfg QueueConfig) error {
	if h == nil {
		return fmt.Errorf("%w: nil handler for queue %q", ErrInvalidConfig, q.Name)
	}
	if err := bindQueue(c, q); err != nil {
		return err
	}
	return c.w.HandleTx(q.Name, func(ctx context.Context, tx pgx.Tx, t *Task) error {
		v, err := decode(q, t)
		if err != nil {
			return err
		}
		return h(ctx, tx, t, v)
	}, cfg)
}

// decode reads the task's payload; a failure is final.
func decode[T any](q outbox.Queue[T], t *Task) (T, error) {
	v, err := q.Decode(t.Payload)
	if err != nil {
		return v, NoRetry(err)
	}
	return v, nil
}
