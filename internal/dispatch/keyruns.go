package dispatch

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// KeyRuns reads how many runs of each concurrency key of queue hold a slot: the
// hash KeyPrefix+"run" (key -> runs) that the claim script counts against the
// cap, summed over the queue's shards (a cap is per shard). Keys with no run
// holding a slot are absent; so is everything while the queue has no limits
// per key. Read-only: one HGETALL per shard, pipelined.
func (c *Client) KeyRuns(ctx context.Context, queue string) (map[string]int, error) {
	n, err := c.Shards(ctx, queue)
	if err != nil {
		return nil, err
	}
	l, err := c.layout(queue, n)
	if err != nil {
		return nil, err
	}
	cmds := make([]*redis.MapStringStringCmd, len(l))
	if _, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range l {
			cmds[i] = p.HGetAll(ctx, k.KeyPrefix+"run")
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("delayq: runs per key of %s: %w", queue, err)
	}
	out := map[string]int{}
	for _, cmd := range cmds {
		for key, s := range cmd.Val() {
			v, err := strconv.Atoi(s)
			if err != nil {
				return nil, fmt.Errorf("delayq: runs per key of %s: %w: key %q holds %q", queue, ErrUnexpectedReply, key, s)
			}
			if v > 0 {
				out[key] += v
			}
		}
	}
	return out, nil
}
