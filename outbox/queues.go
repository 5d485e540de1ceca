package outbox

import (
	"context"
	"fmt"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
)

// QueueControl is a queue's controls as Postgres holds them: whether it is
// paused, its rate limit, its shard count, and the version Redis's mirror is
// keyed by.
type QueueControl = taskstate.QueueControl

// RateLimit caps a queue's starts across every worker: at most Limit per Period
// (default 1 s), up to Burst (default 1) at once; Limit 0 is no limit.
type RateLimit = validate.RateLimit

// PauseQueue pauses queue in Postgres, the truth, and returns its controls. After
// the commit, mirror them into Redis with delayq.Client.SetControls (the relay
// also mirrors every few seconds, so a mirror write that failed is repaired):
// from then on no worker claims from the queue. Tasks keep their due times;
// enqueues go on.
func (c *Client) PauseQueue(ctx context.Context, q Querier, queue string) (QueueControl, error) {
	ctl, err := c.store.SetPaused(ctx, q, queue, true)
	if err != nil {
		return QueueControl{}, fmt.Errorf("outbox: pause: %w", err)
	}
	return ctl, nil
}

// ResumeQueue resumes queue in Postgres and returns its controls; mirror them
// with delayq.Client.SetControls, which wakes the sleeping workers.
func (c *Client) ResumeQueue(ctx context.Context, q Querier, queue string) (QueueControl, error) {
	ctl, err := c.store.SetPaused(ctx, q, queue, false)
	if err != nil {
		return QueueControl{}, fmt.Errorf("outbox: resume: %w", err)
	}
	return ctl, nil
}

// SetQueueRateLimit sets queue's rate limit in Postgres (Limit 0 lifts it) and
// returns its controls; mirror them with delayq.Client.SetControls. A bad limit
// is ErrInvalidRateLimit, and nothing is written.
func (c *Client) SetQueueRateLimit(ctx context.Context, q Querier, queue string, rate RateLimit) (QueueControl, error) {
	ctl, err := c.store.SetRateLimit(ctx, q, queue, rate)
	if err != nil {
		return QueueControl{}, fmt.Errorf("outbox: rate limit: %w", err)
	}
	return ctl, nil
}

// SetQueueShards sets the number of shards queue's Redis keys are split into
// (1..64, delayq.MaxShards; 1 is the default, unsharded layout) in Postgres, the
// truth, and returns its controls. After the commit, mirror them with
// delayq.Client.SetControls (Controls.Shards); the relay also mirrors them every
// few seconds, so every running worker and relay picks the count up within
// seconds.
//
// A task keeps to the shard of the count it was moved to Redis with, so the
// count changes only while the queue is empty: with a pending, queued or dead
// task of the queue it is ErrQueueNotEmpty and nothing is written (check Redis
// too, delayq.Client.Stats: a task enqueued into Redis directly has no row). An
// enqueue that commits while the call runs is not seen: stop the queue's
// producers around a change to be safe. A bad count is ErrInvalidShards, and
// nothing is written. Setting the count the queue has already succeeds and
// changes nothing, not even the version, also on a queue with tasks.
func (c *Client) SetQueueShards(ctx context.Context, q Querier, queue string, shards int) (QueueControl, error) {
	ctl, err := c.store.SetShards(ctx, q, queue, shards)
	if err != nil {
		return QueueControl{}, fmt.Errorf("outbox: shards: %w", err)
	}
	return ctl, nil
}

// QueueControls reads the controls of every queue ever paused, limited or
// sharded, by name.
func (c *Client) QueueControls(ctx context.Context, q Querier) ([]QueueControl, error) {
	out, err := c.store.QueueControls(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return out, nil
}
