package outbox

import (
	"context"
	"fmt"

	"github.com/delayq/delayq/internal/taskstate"
)

// QueueControl is a queue's controls as Postgres holds them: whether it is
// paused, and the version Redis's mirror is keyed by.
type QueueControl = taskstate.QueueControl

// PauseQueue pauses queue in Postgres, the truth, and returns the new version of
// its controls. After the commit, mirror it into Redis with
// delayq.Client.SetPaused(ctx, queue, version, true): from then on no worker claims
// from the queue (the relay also mirrors every few seconds, so a mirror write that
// failed is repaired). Tasks keep their due times; enqueues go on.
func (c *Client) PauseQueue(ctx context.Context, q Querier, queue string) (version int64, err error) {
	v, err := c.store.SetPaused(ctx, q, queue, true)
	if err != nil {
		return 0, fmt.Errorf("outbox: pause: %w", err)
	}
	return v, nil
}

// ResumeQueue resumes queue in Postgres and returns the new version of its
// controls; mirror it with delayq.Client.SetPaused(ctx, queue, version, false),
// which wakes the sleeping workers.
func (c *Client) ResumeQueue(ctx context.Context, q Querier, queue string) (version int64, err error) {
	v, err := c.store.SetPaused(ctx, q, queue, false)
	if err != nil {
		return 0, fmt.Errorf("outbox: resume: %w", err)
	}
	return v, nil
}

// QueueControls reads the controls of every queue ever paused, by name.
func (c *Client) QueueControls(ctx context.Context, q Querier) ([]QueueControl, error) {
	out, err := c.store.QueueControls(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return out, nil
}
