package delayq

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/validate"
)

// QueueTasks are the tasks of one queue, for EnqueuePipelined.
type QueueTasks struct {
	Queue string
	Tasks []Task
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
// When Redis does not know the script (after a restart or SCRIPT FLUSH), it is
// loaded and the calls Redis refused are sent once more.
func (c *Client) EnqueuePipelined(ctx context.Context, batches []QueueTasks) ([][]EnqueueStatus, error) {
	type call struct {
		batch, start, n int
		keys            []string
		args            []any
	}
	var calls []call
	for i, b := range batches {
		k, err := c.Keys(b.Queue)
		if err != nil {
			return nil, err
		}
		for j, t := range b.Tasks {
			if err := c.checkTask(t, validate.MaxPayloadBytes); err != nil {
				return nil, fmt.Errorf("delayq: enqueue %s: task %d: %w", b.Queue, j, err)
			}
		}
		for start := 0; start < len(b.Tasks); start += c.cfg.EnqueueBatch {
			part := b.Tasks[start:min(start+c.cfg.EnqueueBatch, len(b.Tasks))]
			calls = append(calls, call{
				batch: i, start: start, n: len(part),
				keys: []string{k.Ready, k.Active, k.TaskPrefix, k.Dead, k.Priority, k.Control},
				args: c.enqueueArgs(k, part, true),
			})
		}
	}
	out := make([][]EnqueueStatus, len(batches))
	for i, b := range batches {
		out[i] = make([]EnqueueStatus, len(b.Tasks))
	}
	if len(calls) == 0 {
		return out, nil
	}

	cmds := make([]*redis.Cmd, len(calls))
	var register *redis.IntCmd
	send := func(idx []int) {
		// The error is in the commands too, read below.
		_, _ = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			if register == nil {
				register = c.register(ctx, p, batches)
			}
			for _, i := range idx {
				cmds[i] = c.s.enqueue.EvalSha(ctx, p, calls[i].keys, calls[i].args...)
			}
			return nil
		})
	}
	all := make([]int, len(calls))
	for i := range all {
		all[i] = i
	}
	send(all)
	if err := register.Err(); err != nil {
		return nil, fmt.Errorf("delayq: register queues: %w", err)
	}
	// Only the calls Redis refused for want of the script go again: on a Cluster
	// some nodes may know it and have run theirs, whose statuses must stand.
	var again []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		if err := c.s.enqueue.Load(ctx, c.rdb).Err(); err != nil {
			return nil, fmt.Errorf("delayq: enqueue: load script: %w", err)
		}
		send(again)
	}
	for i, cl := range calls {
		v, err := cmds[i].Result()
		if err != nil {
			return nil, fmt.Errorf("delayq: enqueue %s (%d script calls, pipelined): %w", batches[cl.batch].Queue, len(calls), err)
		}
		st, err := parseEnqueue(v, cl.n)
		if err != nil {
			return nil, err
		}
		copy(out[cl.batch][cl.start:], st)
	}
	return out, nil
}

// enqueueArgs builds the ARGV of one enqueue script call (see lua/enqueue.lua).
func (c *Client) enqueueArgs(k Keys, tasks []Task, replaceFinished bool) []any {
	args := make([]any, 0, 3+9*len(tasks))
	replace := "0"
	if replaceFinished {
		replace = "1"
	}
	args = append(args, k.Wake, len(tasks), replace)
	for _, t := range tasks {
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
		args = append(args, t.ID, due, t.Payload, maxAtt, t.Attempt, ver, t.TraceContext, startByArg(t.StartBy), t.Priority)
	}
	return args
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

// RegisteredQueues lists, sorted, every queue a task was ever enqueued into under
// the prefix (the registry that Enqueue and EnqueuePipelined keep): one SMEMBERS,
// whatever the keyspace holds. The relay's reaper visits these.
func (c *Client) RegisteredQueues(ctx context.Context) ([]string, error) {
	qs, err := c.rdb.SMembers(ctx, registryKey(c.cfg.Prefix)).Result()
	if err != nil {
		return nil, fmt.Errorf("delayq: registered queues: %w", err)
	}
	slices.Sort(qs)
	return qs, nil
}
