package outbox

import (
	"context"
	"fmt"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
)

// QueueControl is a queue's controls as Postgres holds them: whether it is
// paused, its rate limit, its shard count, and the version Redis's copy is keyed
// by. Change them with package control, which writes Postgres and then Redis.
type QueueControl = taskstate.QueueControl

// RateLimit caps a queue's starts across every worker: at most Limit per Period
// (default 1 s), up to Burst (default 1) at once; Limit 0 is no limit.
type RateLimit = validate.RateLimit

// QueueControls reads the controls of every queue ever paused, limited or
// sharded, by name.
func (c *Client) QueueControls(ctx context.Context, q Querier) ([]QueueControl, error) {
	out, err := c.store.QueueControls(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return out, nil
}
