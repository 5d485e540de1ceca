package dispatch

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/validate"
)

// RateLimit caps the starts of one queue across every worker: at most Limit per
// Period, up to Burst at once; Limit 0 is no limit. The claim script enforces it
// by the Redis clock (GCRA), so the number of workers does not matter.
type RateLimit = validate.RateLimit

// Controls are a queue's controls as Redis holds them, a versioned copy of
// Postgres's (the truth). Read them with Client.Controls; change them with
// package control, which writes Postgres and then this copy.
type Controls struct {
	// Paused: no worker claims from the queue.
	Paused bool
	// Rate limits the queue's starts (zero value: no limit). A sharded queue's
	// shards share it: each enforces Limit per Shards × Period.
	Rate RateLimit
	// Shards splits the queue's Redis keys into this many shards (1..MaxShards),
	// each in a Cluster slot of its own (ShardKeys): a queue too busy for one
	// Redis master spreads over several. Each task keeps to its shard (ShardOf);
	// claims take from every shard. In a write, 0 keeps the count Redis holds;
	// Controls reports 0 for a queue of one shard.
	Shards int
	// KeyConcurrency caps the runs of one concurrency key at once (0: none);
	// KeyThrottle caps the starts of one key in any KeyWindow (0: none). The
	// claim script parks a task whose key may not start now (claim.lua).
	KeyConcurrency int
	KeyThrottle    int
	KeyWindow      time.Duration
}

// SetControls writes Redis's copy of a queue's controls, and nothing else: use
// package control, which commits the change in Postgres (the truth) first and
// then calls this with the version it committed. A write here that Postgres did
// not commit first is undone by the relay's control sync, or holds a version
// Postgres later gives other controls; TestOneWriterOfRedisControls keeps every
// caller in the module to internal/queuectl.
//
// While Paused, the claim
// script claims nothing from the queue, on every worker, from the next claim on
// (due tasks keep their due times and run when the queue is resumed); Rate caps
// its starts. A resume, or a changed limit, wakes sleeping workers. version is
// the version of the queue's controls in Postgres (the truth); a version not
// newer than the one Redis holds changes nothing, and applied is false (for a
// sharded queue: than the one every shard holds; the shards behind are brought
// up).
func (c *Client) SetControls(ctx context.Context, queue string, version int64, ctl Controls) (applied bool, err error) {
	if err := validate.Queue(queue); err != nil {
		return false, err
	}
	if version < 1 || version >= 1e15 {
		return false, fmt.Errorf("%w: controls version %d: 1..10^15-1", ErrInvalidArgument, version)
	}
	if ctl.Shards < 0 || ctl.Shards > MaxShards {
		return false, fmt.Errorf("%w: %d shards: 1..%d, or 0 to keep the count", ErrInvalidArgument, ctl.Shards, MaxShards)
	}
	rate := ctl.Rate.WithDefaults()
	if err := rate.Validate(); err != nil {
		return false, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	window := ctl.KeyWindow
	if ctl.KeyThrottle == 0 {
		window = time.Second // no throttle: the window is a placeholder
	}
	if err := validate.KeyLimits(ctl.KeyConcurrency, ctl.KeyThrottle, window); err != nil {
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
	// Every shard holds the controls and the count; the claim script takes its
	// shard's share of the rate from them (Limit starts per n periods, a burst of
	// Burst/n, at least 1). The shards of the count Redis held before get the new
	// count too, so that an enqueue routed by the old one is refused there
	// (enqueue.lua).
	old, err := c.readShards(ctx, queue)
	if err != nil {
		return false, err
	}
	n := cmp.Or(ctl.Shards, old)
	layout, err := c.layout(queue, n)
	if err != nil {
		return false, err
	}
	if old != n {
		before, err := c.layout(queue, old)
		if err != nil {
			return false, err
		}
		layout = append(slices.Clone(layout), before[1:]...)
	}
	calls := make([]scriptCall, len(layout))
	for i, k := range layout {
		calls[i] = scriptCall{keys: []string{k.Control, k.Ready, k.Priority, k.TaskPrefix, k.KeyPrefix},
			args: []any{k.Wake, version, p, rate.Limit, ms(rate.Period), rate.Burst, n,
				ctl.KeyConcurrency, ctl.KeyThrottle, ms(window)}}
	}
	for _, r := range c.each(ctx, s, calls) {
		if r.err != nil {
			return false, fmt.Errorf("delayq: set controls %s: %w", queue, r.err)
		}
		code, err := parseCode(r.val, "ctl", 0, 1)
		if err != nil {
			return false, err
		}
		applied = applied || code == 1
	}
	c.forgetShards(queue)
	return applied, nil
}

// Controls reads queue's controls as Redis holds them in its shard 0 (what the
// claim script reads there), and their version: the oldest any shard holds (0
// when one holds none), so that a shard left behind, or lost with its master's
// data, is written again by the next mirror. Shards is 0 for a queue of one
// shard.
func (c *Client) Controls(ctx context.Context, queue string) (ctl Controls, version int64, err error) {
	k, err := c.Keys(queue)
	if err != nil {
		return Controls{}, 0, err
	}
	v, err := c.rdb.HMGet(ctx, k.Control, "v", "p", "r", "w", "b", "n", "kc", "kn", "kw").Result()
	if err != nil {
		return Controls{}, 0, fmt.Errorf("delayq: controls %s: %w", queue, err)
	}
	num := func(v []any, i int) int64 {
		s, _ := v[i].(string)
		n, _ := strconv.ParseInt(s, 10, 64)
		return n
	}
	ctl.Paused = v[1] == "1"
	n := int(min(max(num(v, 5), 1), MaxShards))
	if n > 1 {
		ctl.Shards = n
	}
	if r := num(v, 2); r > 0 {
		ctl.Rate = RateLimit{Limit: int(r), Period: time.Duration(num(v, 3)) * time.Millisecond, Burst: int(num(v, 4))}
	}
	ctl.KeyConcurrency = int(num(v, 6))
	if ctl.KeyThrottle = int(num(v, 7)); ctl.KeyThrottle > 0 {
		ctl.KeyWindow = time.Duration(num(v, 8)) * time.Millisecond
	}
	version = num(v, 0)
	if n == 1 {
		return ctl, version, nil
	}
	l, err := c.layout(queue, n)
	if err != nil {
		return Controls{}, 0, err
	}
	cmds := make([]*redis.SliceCmd, n-1)
	_, err = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range l[1:] {
			cmds[i] = p.HMGet(ctx, k.Control, "v")
		}
		return nil
	})
	if err != nil {
		return Controls{}, 0, fmt.Errorf("delayq: controls %s: %w", queue, err)
	}
	for _, cmd := range cmds {
		version = min(version, num(cmd.Val(), 0))
	}
	return ctl, version, nil
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
