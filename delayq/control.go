package delayq

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/validate"
)

// RateLimit caps the starts of one queue across every worker: at most Limit per
// Period, up to Burst at once; Limit 0 is no limit. The claim script enforces it
// by the Redis clock (GCRA), so the number of workers does not matter.
type RateLimit = validate.RateLimit

// Controls are a queue's controls as Redis mirrors them from Postgres.
type Controls struct {
	// Paused: no worker claims from the queue.
	Paused bool
	// Rate limits the queue's starts (zero value: no limit). A sharded queue's
	// shards share it: each enforces Limit per Shards × Period.
	Rate RateLimit
	// Shards splits the queue's Redis keys into this many shards (1..MaxShards;
	// 0 is 1), each in a Cluster slot of its own (ShardKeys): a queue too busy for
	// one Redis master spreads over several. Each task keeps to its shard
	// (ShardOf); claims take from every shard.
	Shards int
}

// SetControls mirrors a queue's controls into Redis: while Paused, the claim
// script claims nothing from the queue, on every worker, from the next claim on
// (due tasks keep their due times and run when the queue is resumed); Rate caps
// its starts. A resume, or a changed limit, wakes sleeping workers. version is
// the version of the queue's controls in Postgres (the truth:
// outbox.Client.PauseQueue and SetQueueRateLimit return it); a version not newer
// than the one Redis holds changes nothing, and applied is false.
func (c *Client) SetControls(ctx context.Context, queue string, version int64, ctl Controls) (applied bool, err error) {
	k, err := c.Keys(queue)
	if err != nil {
		return false, err
	}
	if version < 1 || version >= 1e15 {
		return false, fmt.Errorf("%w: controls version %d: 1..10^15-1", ErrInvalidArgument, version)
	}
	rate := ctl.Rate.WithDefaults()
	if err := rate.Validate(); err != nil {
		return false, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	s, err := adminScript("ctl")
	if err != nil {
		return false, err
	}
	p := "0"
	if ctl.Paused {
		p = "1"
	}
	v, err := c.run(ctx, s, []string{k.Control}, k.Wake, version, p, rate.Limit, ms(rate.Period), rate.Burst)
	if err != nil {
		return false, fmt.Errorf("delayq: set controls %s: %w", queue, err)
	}
	code, err := parseCode(v, "ctl", 0, 1)
	return code == 1, err
}

// Controls reads queue's controls as Redis holds them (what the claim script
// reads), and their version (0 when Redis holds none).
func (c *Client) Controls(ctx context.Context, queue string) (ctl Controls, version int64, err error) {
	k, err := c.Keys(queue)
	if err != nil {
		return Controls{}, 0, err
	}
	v, err := c.rdb.HMGet(ctx, k.Control, "v", "p", "r", "w", "b").Result()
	if err != nil {
		return Controls{}, 0, fmt.Errorf("delayq: controls %s: %w", queue, err)
	}
	num := func(i int) int64 {
		s, _ := v[i].(string)
		n, _ := strconv.ParseInt(s, 10, 64)
		return n
	}
	ctl.Paused = v[1] == "1"
	if n := num(2); n > 0 {
		ctl.Rate = RateLimit{Limit: int(n), Period: time.Duration(num(3)) * time.Millisecond, Burst: int(num(4))}
	}
	return ctl, num(0), nil
}

// PausedMany reports, for each of queues, whether it is paused in Redis, with one
// pipelined round trip.
func (c *Client) PausedMany(ctx context.Context, queues ...string) (map[string]bool, error) {
	cmds := make([]*redis.SliceCmd, len(queues))
	keys := make([]string, len(queues))
	for i, q := range queues {
		k, err := c.Keys(q)
		if err != nil {
			return nil, err
		}
		keys[i] = k.Control
	}
	out := make(map[string]bool, len(queues))
	if len(queues) == 0 {
		return out, nil
	}
	_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.HMGet(ctx, k, "p")
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("delayq: paused: %w", err)
	}
	for i, q := range queues {
		v := cmds[i].Val()
		out[q] = len(v) == 1 && v[0] == "1"
	}
	return out, nil
}
