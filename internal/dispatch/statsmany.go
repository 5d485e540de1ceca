package dispatch

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
	if len(queues) == 0 {
		return nil, nil
	}
	keys, of, err := c.everyShard(ctx, queues)
	if err != nil {
		return nil, err
	}
	calls := make([]scriptCall, len(keys))
	for j, k := range keys {
		calls[j] = scriptCall{keys: []string{k.Ready, k.Active, k.Dead, k.KeyPrefix}}
	}
	parts := make([][]Stats, len(queues))
	now := make([]time.Time, len(keys))
	for j, cmd := range c.runPipelined(ctx, c.s.stats, calls, nil) {
		q := queues[of[j]]
		v, err := cmd.Result()
		if err != nil {
			return nil, fmt.Errorf("delayq: stats %s: %w", q, err)
		}
		st, err := parseStats(v)
		if err != nil {
			return nil, fmt.Errorf("delayq: stats %s: %w", q, err)
		}
		parts[of[j]] = append(parts[of[j]], st)
		now[j] = st.Now
	}
	out := make([]QueueStats, len(queues))
	for i, q := range queues {
		out[i] = QueueStats{Queue: q, Stats: sumStats(parts[i])}
	}
	counts := make([]*redis.IntCmd, len(keys))
	_, _ = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for j, k := range keys {
			counts[j] = p.ZCount(ctx, k.Ready, "-inf", "("+formatScore(now[j].Add(-overdueAfter)))
		}
		return nil
	})
	for j, cmd := range counts {
		n, err := cmd.Result()
		if err != nil {
			return nil, fmt.Errorf("delayq: overdue %s: %w", queues[of[j]], err)
		}
		out[of[j]].Overdue += n
	}
	return out, nil
}
