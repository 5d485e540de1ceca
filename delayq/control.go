package delayq

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// SetPaused mirrors a queue's pause flag into Redis: while it is set, the claim
// script claims nothing from the queue, on every worker, from the next claim on;
// due tasks keep their due times and run when the queue is resumed (a resume
// wakes sleeping workers). version is the version of the queue's controls in
// Postgres (the truth: outbox.Client.PauseQueue returns it); a version not newer
// than the one Redis holds changes nothing, and applied is false.
func (c *Client) SetPaused(ctx context.Context, queue string, version int64, paused bool) (applied bool, err error) {
	k, err := c.Keys(queue)
	if err != nil {
		return false, err
	}
	if version < 1 || version >= 1e15 {
		return false, fmt.Errorf("%w: controls version %d: 1..10^15-1", ErrInvalidArgument, version)
	}
	s, err := adminScript("ctl")
	if err != nil {
		return false, err
	}
	p := "0"
	if paused {
		p = "1"
	}
	v, err := c.run(ctx, s, []string{k.Control}, k.Wake, version, p)
	if err != nil {
		return false, fmt.Errorf("delayq: set paused %s: %w", queue, err)
	}
	code, err := parseCode(v, "ctl", 0, 1)
	return code == 1, err
}

// Paused reports whether queue is paused in Redis (what the claim script reads).
func (c *Client) Paused(ctx context.Context, queue string) (bool, error) {
	k, err := c.Keys(queue)
	if err != nil {
		return false, err
	}
	v, err := c.rdb.HMGet(ctx, k.Control, "p").Result()
	if err != nil {
		return false, fmt.Errorf("delayq: paused %s: %w", queue, err)
	}
	return len(v) == 1 && v[0] == "1", nil
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
