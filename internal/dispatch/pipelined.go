package dispatch

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// scriptCall is one call of a script: its keys (one slot) and arguments.
type scriptCall struct {
	keys []string
	args []any
}

// runPipelined runs s once per call in one pipelined round trip (on a Cluster one
// pipeline per node, sent side by side) and returns each call's command, its reply
// or error read from it. first, when not nil, adds commands at the head of the
// first send. The calls Redis refused for want of the script go once more as EVAL,
// which caches it (not SCRIPT LOAD: an operator's ACL user may run scripts without
// being allowed to load them, docs/SECURITY.md); on a Cluster some nodes may have
// known it and run theirs, whose replies stand.
func (c *Client) runPipelined(ctx context.Context, s *redis.Script, calls []scriptCall, first func(p redis.Pipeliner)) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	send := func(idx []int, eval bool) {
		// The error is in the commands too, read by the caller.
		_, _ = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			if first != nil {
				first(p)
				first = nil
			}
			for _, i := range idx {
				if eval {
					cmds[i] = s.Eval(ctx, p, calls[i].keys, calls[i].args...)
				} else {
					cmds[i] = s.EvalSha(ctx, p, calls[i].keys, calls[i].args...)
				}
			}
			return nil
		})
	}
	all := make([]int, len(calls))
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
		send(again, true)
	}
	return cmds
}

// reply is one script call's reply or error.
type reply struct {
	val any
	err error
}

// each runs s once per call, a single call directly, several in one pipelined
// round trip (runPipelined), and returns their replies in order.
func (c *Client) each(ctx context.Context, s *redis.Script, calls []scriptCall) []reply {
	out := make([]reply, len(calls))
	if len(calls) == 1 {
		out[0].val, out[0].err = c.run(ctx, s, calls[0].keys, calls[0].args...)
		return out
	}
	for i, cmd := range c.runPipelined(ctx, s, calls, nil) {
		out[i].val, out[i].err = cmd.Result()
	}
	return out
}

// perShard runs s over ids grouped by shard (the layout l): one call a shard
// holding any of them, with that shard's keys(k) and its ids as ARGV, in one
// round trip. read gets each reply with its ids and their positions in ids.
func (c *Client) perShard(ctx context.Context, s *redis.Script, l []Keys, ids []string,
	keys func(Keys) []string, read func(v any, ids []string, pos []int) error) error {
	groups := byShard(l, len(ids), func(i int) string { return ids[i] })
	calls := make([]scriptCall, 0, len(groups))
	var at [][]int
	for k, pos := range groups {
		args := make([]any, len(pos))
		for j, p := range pos {
			args[j] = ids[p]
		}
		calls = append(calls, scriptCall{keys: keys(l[k]), args: args})
		at = append(at, pos)
	}
	for i, r := range c.each(ctx, s, calls) {
		if r.err != nil {
			return r.err
		}
		part := make([]string, len(at[i]))
		for j, p := range at[i] {
			part[j] = ids[p]
		}
		if err := read(r.val, part, at[i]); err != nil {
			return err
		}
	}
	return nil
}
