package delayq

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// QueueStats is what StatsMany reads of one queue.
type QueueStats struct {
	Queue string
	Stats
	// Overdue counts the ready tasks due more than StatsMany's overdueAfter ago
	// by the Redis clock (Stats.Now): due, and not claimed for that long.
	Overdue int64
}

// StatsMany reads Stats and the overdue count of every queue in two pipelined
// round trips, whatever the number of queues: the stats script of each queue, then
// a ZCOUNT of each ready ZSET on the clock its script read. It is Stats and Overdue
// of each queue, without a round trip per queue and call.
func (c *Client) StatsMany(ctx context.Context, overdueAfter time.Duration, queues ...string) ([]QueueStats, error) {
	if overdueAfter < 0 {
		return nil, fmt.Errorf("%w: overdue after %v", ErrInvalidArgument, overdueAfter)
	}
	keys := make([]Keys, len(queues))
	for i, q := range queues {
		k, err := c.Keys(q)
		if err != nil {
			return nil, err
		}
		keys[i] = k
	}
	if len(queues) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.Cmd, len(queues))
	send := func(idx []int, eval bool) {
		// The error is in the commands too, read below.
		_, _ = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range idx {
				k := []string{keys[i].Ready, keys[i].Active, keys[i].Dead}
				if eval {
					cmds[i] = c.s.stats.Eval(ctx, p, k)
				} else {
					cmds[i] = c.s.stats.EvalSha(ctx, p, k)
				}
			}
			return nil
		})
	}
	all := make([]int, len(queues))
	for i := range all {
		all[i] = i
	}
	send(all, false)
	var again []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		// EVAL, not SCRIPT LOAD: an operator's ACL user may run scripts without
		// being allowed to load them (docs/SECURITY.md), and EVAL caches it too.
		send(again, true)
	}
	out := make([]QueueStats, len(queues))
	for i, q := range queues {
		v, err := cmds[i].Result()
		if err != nil {
			return nil, fmt.Errorf("delayq: stats %s: %w", q, err)
		}
		out[i].Queue = q
		if out[i].Stats, err = parseStats(v); err != nil {
			return nil, fmt.Errorf("delayq: stats %s: %w", q, err)
		}
	}
	counts := make([]*redis.IntCmd, len(queues))
	_, _ = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			counts[i] = p.ZCount(ctx, k.Ready, "-inf", "("+formatScore(out[i].Now.Add(-overdueAfter)))
		}
		return nil
	})
	for i, q := range queues {
		n, err := counts[i].Result()
		if err != nil {
			return nil, fmt.Errorf("delayq: overdue %s: %w", q, err)
		}
		out[i].Overdue = n
	}
	return out, nil
}
