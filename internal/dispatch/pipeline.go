package dispatch

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/validate"
)

// QueueTasks are the tasks of one queue, for EnqueuePipelined.
type QueueTasks struct {
	Queue string
	Tasks []Task
	// Shards, when set (1..MaxShards), is the queue's shard count as the caller
	// holds it (the relay: delayq_queues.shards, read with the rows it moves),
	// and the tasks are routed by it, whatever count Redis holds or has lost. A
	// shard whose controls hold another count refuses its call, and
	// EnqueuePipelined returns ErrShardCount. 0 routes by the count Redis holds,
	// as the Client knows it (Client.Shards), and routes a refused call anew.
	Shards int
}

// ValidateTask checks t as EnqueuePipelined would (id, payload size up to the hard
// limit validate.MaxPayloadBytes, attempts, version, run time), without touching
// Redis. The error wraps ErrInvalidTaskID or ErrInvalidTask. The relay uses it to set
// aside a row Redis would refuse, instead of letting it fail every batch it is in;
// with the outbox's own checks, no row the outbox accepted is refused.
func (c *Client) ValidateTask(t Task) error { return c.checkTask(t, validate.MaxPayloadBytes) }

// EnqueuePipelined is the relay's move of outbox rows it holds locked as pending.
// It enqueues the tasks of several queues in one pipelined round trip:
// one enqueue script call per queue and per Config.EnqueueBatch tasks, all sent
// together (on a Cluster, one pipeline per node). The statuses come back in the
// shape of batches: out[i][j] is the status of batches[i].Tasks[j].
//
// Because the caller holds each task's row as live, a done or dead record of the id
// in Redis is an earlier life of it (a reused id, a task retried from dead) and is
// replaced. Payloads are checked against the hard limit, not Config.MaxPayloadBytes:
// the outbox already applied its own.
//
// Every queue name and task is validated before anything is sent. The calls are
// independent: on an error some of them may have been applied. Since an enqueue of
// an existing task is a duplicate, repeating the whole call is safe.
//
// The tasks of a sharded queue go to their shards (ShardOf), one call per shard,
// by QueueTasks.Shards when set. When Redis does not know the script (after a restart or SCRIPT FLUSH), the
// calls Redis refused are sent once more.
func (c *Client) EnqueuePipelined(ctx context.Context, batches []QueueTasks) ([][]EnqueueStatus, error) {
	for _, b := range batches {
		if err := validate.Queue(b.Queue); err != nil {
			return nil, err
		}
		if b.Shards < 0 || b.Shards > MaxShards {
			return nil, fmt.Errorf("%w: enqueue %s: %d shards: 1..%d, or 0 for Redis's count", ErrInvalidArgument, b.Queue, b.Shards, MaxShards)
		}
		for j, t := range b.Tasks {
			if err := c.checkTask(t, validate.MaxPayloadBytes); err != nil {
				return nil, fmt.Errorf("delayq: enqueue %s: task %d: %w", b.Queue, j, err)
			}
		}
	}
	return c.enqueue(ctx, batches, true)
}

// enqueueCall is one enqueue script call: tasks of one shard of one batch, at the
// positions pos of batches[batch].Tasks.
type enqueueCall struct {
	batch int
	pos   []int
	scriptCall
	held string // of a refused call: the count the shard holds
}

// shardCountErr is the error of a batch routed by b.Shards that a shard holding
// the count held refused.
func shardCountErr(b QueueTasks, held string) error {
	return fmt.Errorf("%w: enqueue %s: routed by %d shards, Redis holds %s", ErrShardCount, b.Queue, b.Shards, held)
}

// enqueue routes the validated tasks of batches to their shards, one script call
// per shard and Config.EnqueueBatch tasks, sends all calls in one pipelined round
// trip with the queues' registration, and returns the statuses in the shape of
// batches. The calls a shard refused for a stale shard count ("SHARDS <n>",
// nothing written) go once more, routed by the count read anew; a batch routed by
// the caller's count (QueueTasks.Shards) is not routed anew: its refusal is
// ErrShardCount.
func (c *Client) enqueue(ctx context.Context, batches []QueueTasks, replaceFinished bool) ([][]EnqueueStatus, error) {
	out := make([][]EnqueueStatus, len(batches))
	var calls []enqueueCall
	for i, b := range batches {
		out[i] = make([]EnqueueStatus, len(b.Tasks))
		var err error
		if calls, err = c.enqueueCalls(ctx, calls, i, b, nil, replaceFinished); err != nil {
			return nil, err
		}
	}
	if len(calls) == 0 {
		return out, nil
	}
	var register *redis.IntCmd
	refused, err := c.sendEnqueue(ctx, batches, calls, out, func(p redis.Pipeliner) { register = c.register(ctx, p, batches) })
	if err != nil {
		return nil, err
	}
	if err := register.Err(); err != nil {
		return nil, fmt.Errorf("delayq: register queues: %w", err)
	}
	if len(refused) == 0 {
		return out, nil
	}
	for _, cl := range refused {
		if b := batches[cl.batch]; b.Shards > 0 {
			return nil, shardCountErr(b, cl.held)
		}
	}
	calls = calls[:0]
	for _, cl := range refused {
		c.forgetShards(batches[cl.batch].Queue)
	}
	for _, cl := range refused {
		if calls, err = c.enqueueCalls(ctx, calls, cl.batch, batches[cl.batch], cl.pos, replaceFinished); err != nil {
			return nil, err
		}
	}
	if refused, err = c.sendEnqueue(ctx, batches, calls, out, nil); err != nil {
		return nil, err
	}
	if len(refused) > 0 {
		return nil, fmt.Errorf("delayq: enqueue %s: the shard count changed twice during the call", batches[refused[0].batch].Queue)
	}
	return out, nil
}

// enqueueCalls appends the calls that enqueue the tasks of b at positions pos (all
// of them when pos is nil) into their shards.
func (c *Client) enqueueCalls(ctx context.Context, calls []enqueueCall, batch int, b QueueTasks, pos []int, replaceFinished bool) ([]enqueueCall, error) {
	if len(b.Tasks) == 0 {
		return calls, nil
	}
	l, err := c.routed(ctx, b.Queue, b.Shards)
	if err != nil {
		return nil, err
	}
	if pos == nil {
		pos = make([]int, len(b.Tasks))
		for i := range pos {
			pos[i] = i
		}
	}
	groups := byShard(l, len(pos), func(i int) string { return b.Tasks[pos[i]].ID })
	for k, g := range groups {
		for start := 0; start < len(g); start += c.cfg.EnqueueBatch {
			part := g[start:min(start+c.cfg.EnqueueBatch, len(g))]
			at := make([]int, len(part))
			tasks := make([]Task, len(part))
			for j, p := range part {
				at[j] = pos[p]
				tasks[j] = b.Tasks[pos[p]]
			}
			kk := l[k]
			calls = append(calls, enqueueCall{batch: batch, pos: at, scriptCall: scriptCall{
				keys: []string{kk.Ready, kk.Active, kk.TaskPrefix, kk.Dead, kk.Priority, kk.Control, kk.KeyPrefix},
				args: c.enqueueArgs(kk, tasks, replaceFinished, len(l)),
			}})
		}
	}
	return calls, nil
}

// sendEnqueue runs calls in one pipelined round trip, writes their statuses into
// out, and returns the calls refused for a stale shard count.
func (c *Client) sendEnqueue(ctx context.Context, batches []QueueTasks, calls []enqueueCall, out [][]EnqueueStatus, first func(redis.Pipeliner)) ([]enqueueCall, error) {
	sc := make([]scriptCall, len(calls))
	for i, cl := range calls {
		sc[i] = cl.scriptCall
	}
	cmds := c.runPipelined(ctx, c.s.enqueue, sc, first)
	var refused []enqueueCall
	for i, cl := range calls {
		v, err := cmds[i].Result()
		if err != nil && redis.HasErrorPrefix(err, "SHARDS") {
			cl.held = strings.TrimSpace(strings.TrimPrefix(err.Error(), "SHARDS"))
			refused = append(refused, cl)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("delayq: enqueue %s (%d script calls, pipelined): %w", batches[cl.batch].Queue, len(calls), err)
		}
		st, err := parseEnqueue(v, len(cl.pos))
		if err != nil {
			return nil, err
		}
		for j, p := range cl.pos {
			out[cl.batch][p] = st[j]
		}
	}
	return refused, nil
}

// enqueueArgs builds the ARGV of one enqueue script call (see lua/enqueue.lua).
func (c *Client) enqueueArgs(k Keys, tasks []Task, replaceFinished bool, shards int) []any {
	args := make([]any, 0, 4+(1+taskFields)*len(tasks))
	replace := "0"
	if replaceFinished {
		replace = "1"
	}
	args = append(args, k.Wake, len(tasks), replace, shards)
	for _, t := range tasks {
		args = c.appendTask(append(args, t.ID), t)
	}
	return args
}

// taskFields is how many arguments appendTask adds.
const taskFields = 9

// appendTask appends what the scripts write into a task hash, in the order both
// enqueue.lua and repair.lua's restore take it (lib.lua write_task): due,
// payload, max_attempts, attempt, version, trace context, start_by, priority.
// Enqueue and restore share it, so a restored task is the relay's, field for
// field.
func (c *Client) appendTask(args []any, t Task) []any {
	due := "now"
	if !t.RunAt.IsZero() {
		due = formatScore(t.RunAt)
	}
	maxAtt, ver := t.MaxAttempts, t.Version
	if maxAtt == 0 {
		maxAtt = c.cfg.DefaultMaxAttempts
	}
	if ver == 0 {
		ver = 1
	}
	return append(args, due, t.Payload, maxAtt, t.Attempt, ver, t.TraceContext, startByArg(t.StartBy), t.Priority, t.Key)
}

// startByArg is a start deadline as the scripts take it: Unix ms, rounded down
// (a task never starts after its deadline), or "" for none.
func startByArg(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return strconv.FormatInt(t.UnixMilli(), 10)
}

// register adds the queues of batches to the queue registry (the reaper's list of
// queues to visit), in the caller's pipeline.
func (c *Client) register(ctx context.Context, p redis.Pipeliner, batches []QueueTasks) *redis.IntCmd {
	queues := make([]any, len(batches))
	for i, b := range batches {
		queues[i] = b.Queue
	}
	return p.SAdd(ctx, registryKey(c.cfg.Prefix), queues...)
}

// Register adds queues to the queue registry: a worker registers the queues it
// serves when it starts, so that the dashboard and delayq stats list a queue
// before its first task (and it can be paused then). One SADD.
func (c *Client) Register(ctx context.Context, queues ...string) error {
	if len(queues) == 0 {
		return nil
	}
	members := make([]any, len(queues))
	for i, q := range queues {
		members[i] = q
	}
	if err := c.rdb.SAdd(ctx, registryKey(c.cfg.Prefix), members...).Err(); err != nil {
		return fmt.Errorf("delayq: register queues: %w", err)
	}
	return nil
}

// RegisteredQueues lists, sorted, every queue a task was ever enqueued into under
// the prefix (the registry that Enqueue and EnqueuePipelined keep) or a worker
// registered (Register): one SMEMBERS, whatever the keyspace holds. The relay's
// reaper visits these.
func (c *Client) RegisteredQueues(ctx context.Context) ([]string, error) {
	qs, err := c.rdb.SMembers(ctx, registryKey(c.cfg.Prefix)).Result()
	if err != nil {
		return nil, fmt.Errorf("delayq: registered queues: %w", err)
	}
	slices.Sort(qs)
	return qs, nil
}
