package delayq

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/validate"
)

//go:embed lua/*.lua
var luaFS embed.FS

const (
	maxClaim    = 1000
	maxComplete = 1000
	maxReap     = 10000
	maxInspect  = 1000
	// MaxErrorBytes is the longest error summary kept; longer ones are cut.
	MaxErrorBytes = 1024
	// maxMS is the largest duration in ms the scripts accept (2^40 ms, ~35 years).
	maxMS = 1 << 40
)

type scripts struct {
	enqueue, claim, extend, complete, retry, kill, release,
	reap, remove, stats, inspect *redis.Script
}

func loadScripts() (scripts, error) {
	var s scripts
	for _, x := range []struct {
		name string
		dst  **redis.Script
	}{
		{"enqueue", &s.enqueue}, {"claim", &s.claim}, {"extend", &s.extend},
		{"complete", &s.complete}, {"retry", &s.retry}, {"kill", &s.kill},
		{"release", &s.release}, {"reap", &s.reap},
		{"remove", &s.remove}, {"stats", &s.stats}, {"inspect", &s.inspect},
	} {
		src, err := scriptSource(x.name)
		if err != nil {
			return scripts{}, err
		}
		*x.dst = redis.NewScript(src)
	}
	return s, nil
}

// scriptSource returns script name as Redis runs it: a line naming it, the shared
// helpers of lua/lib.lua, then lua/<name>.lua.
func scriptSource(name string) (string, error) {
	lib, err := luaFS.ReadFile("lua/lib.lua")
	if err != nil {
		return "", fmt.Errorf("delayq: script helpers: %w", err)
	}
	src, err := luaFS.ReadFile("lua/" + name + ".lua")
	if err != nil {
		return "", fmt.Errorf("delayq: script %s: %w", name, err)
	}
	return "local SCRIPT = '" + name + "'\n" + string(lib) + string(src), nil
}

// Client runs the delayq scripts on one Redis deployment (single node, Sentinel or
// Cluster). It is safe for concurrent use and holds no connection of its own; a
// Waiter holds one pub/sub connection.
type Client struct {
	rdb redis.UniversalClient
	cfg Config
	s   scripts
}

// New returns a Client on rdb. cfg is completed with WithDefaults and validated.
func New(rdb redis.UniversalClient, cfg Config) (*Client, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil redis client", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s, err := loadScripts()
	if err != nil {
		return nil, err
	}
	return &Client{rdb: rdb, cfg: cfg, s: s}, nil
}

// Config returns the effective configuration (defaults applied).
func (c *Client) Config() Config { return c.cfg }

// Keys returns the Redis keys of queue.
func (c *Client) Keys(queue string) (Keys, error) { return KeysFor(c.cfg.Prefix, queue) }

func (c *Client) run(ctx context.Context, s *redis.Script, keys []string, args ...any) (any, error) {
	return s.Run(ctx, c.rdb, keys, args...).Result()
}

// ms converts a positive duration to whole milliseconds, rounding up.
func ms(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func cutError(s string) string {
	if len(s) <= MaxErrorBytes {
		return s
	}
	return s[:MaxErrorBytes]
}

// Enqueue adds tasks to queue, one script call per Config.EnqueueBatch tasks, and
// reports what happened to each (same order). A task whose hash exists is a
// Duplicate; see Task.Version for replacement. All tasks are validated before
// anything is written; an error after that leaves earlier batches written.
func (c *Client) Enqueue(ctx context.Context, queue string, tasks ...Task) ([]EnqueueStatus, error) {
	k, err := c.Keys(queue)
	if err != nil {
		return nil, err
	}
	for i, t := range tasks {
		if err := c.checkTask(t, c.cfg.MaxPayloadBytes); err != nil {
			return nil, fmt.Errorf("delayq: enqueue %s: task %d: %w", queue, i, err)
		}
	}
	out := make([]EnqueueStatus, 0, len(tasks))
	if len(tasks) > 0 {
		if err := c.rdb.SAdd(ctx, registryKey(c.cfg.Prefix), queue).Err(); err != nil {
			return out, fmt.Errorf("delayq: enqueue %s: register the queue: %w", queue, err)
		}
	}
	for start := 0; start < len(tasks); start += c.cfg.EnqueueBatch {
		batch := tasks[start:min(start+c.cfg.EnqueueBatch, len(tasks))]
		v, err := c.run(ctx, c.s.enqueue, []string{k.Ready, k.Active, k.TaskPrefix, k.Dead, k.Priority, k.Control}, c.enqueueArgs(k, batch, false)...)
		if err != nil {
			return out, fmt.Errorf("delayq: enqueue %s: %w", queue, err)
		}
		st, err := parseEnqueue(v, len(batch))
		if err != nil {
			return out, err
		}
		out = append(out, st...)
	}
	return out, nil
}

func (c *Client) checkTask(t Task, maxPayload int) error {
	if err := validate.TaskID(t.ID); err != nil {
		return err
	}
	switch {
	case len(t.Payload) > maxPayload:
		return fmt.Errorf("%w: %q: payload %d bytes, at most %d", ErrInvalidTask, t.ID, len(t.Payload), maxPayload)
	case t.MaxAttempts < 0 || t.MaxAttempts > validate.MaxAttempts:
		return fmt.Errorf("%w: %q: MaxAttempts %d: 0..%d", ErrInvalidTask, t.ID, t.MaxAttempts, validate.MaxAttempts)
	case t.Attempt < 0 || t.Attempt > validate.MaxAttempts:
		return fmt.Errorf("%w: %q: Attempt %d: 0..%d", ErrInvalidTask, t.ID, t.Attempt, validate.MaxAttempts)
	case t.Version < 0 || t.Version > validate.MaxVersion:
		return fmt.Errorf("%w: %q: Version %d: 0..2^31-1", ErrInvalidTask, t.ID, t.Version)
	case validate.TraceContext(t.TraceContext) != nil:
		return fmt.Errorf("%w: %q: %w", ErrInvalidTask, t.ID, validate.TraceContext(t.TraceContext))
	case !t.RunAt.IsZero() && (t.RunAt.UnixMilli() < 0 || t.RunAt.UnixMilli() > 1e14):
		return fmt.Errorf("%w: %q: RunAt %v out of range", ErrInvalidTask, t.ID, t.RunAt)
	case !t.StartBy.IsZero() && (t.StartBy.UnixMilli() < 1 || t.StartBy.UnixMilli() > 1e14):
		return fmt.Errorf("%w: %q: StartBy %v out of range", ErrInvalidTask, t.ID, t.StartBy)
	case validate.Priority(t.Priority) != nil:
		return fmt.Errorf("%w: %q: %w", ErrInvalidTask, t.ID, validate.Priority(t.Priority))
	}
	return nil
}

// Claim leases up to max due tasks of queue for lease (rounded up to a whole ms),
// by the Redis clock. With no task due, Claim.Tasks is empty and Claim.NextDue says
// how long to wait (see Waiter).
func (c *Client) Claim(ctx context.Context, queue string, max int, lease time.Duration) (Claim, error) {
	k, err := c.Keys(queue)
	if err != nil {
		return Claim{}, err
	}
	if max < 1 || max > maxClaim {
		return Claim{}, fmt.Errorf("%w: claim max %d: 1..%d", ErrInvalidArgument, max, maxClaim)
	}
	if lease <= 0 || ms(lease) > maxMS {
		return Claim{}, fmt.Errorf("%w: lease %v: must be positive", ErrInvalidArgument, lease)
	}
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	v, err := c.run(ctx, c.s.claim, []string{k.Ready, k.Active, k.TaskPrefix, k.Control, k.History, k.Priority}, max, ms(lease), hex.EncodeToString(b[:]))
	if err != nil {
		return Claim{}, fmt.Errorf("delayq: claim %s: %w", queue, err)
	}
	return parseClaim(v, queue)
}

func (c *Client) leaseArgs(queue, id, token string) (Keys, error) {
	k, err := keysForTask(c.cfg.Prefix, queue, id)
	if err != nil {
		return Keys{}, err
	}
	if err := checkToken(token); err != nil {
		return Keys{}, err
	}
	return k, nil
}

func checkToken(token string) error {
	if token == "" || len(token) > 100 {
		return fmt.Errorf("%w: lease token of %d bytes", ErrInvalidArgument, len(token))
	}
	return nil
}

func leaseLost(op, queue, id string) error {
	return fmt.Errorf("delayq: %s %s/%s: %w", op, queue, id, ErrLeaseLost)
}

// Extend renews the lease of a claimed task to lease from now (Redis clock).
// ErrLeaseLost: the token no longer holds the task; nothing changed.
func (c *Client) Extend(ctx context.Context, queue, id, token string, lease time.Duration) error {
	renewed, err := c.ExtendMany(ctx, queue, []Lease{{ID: id, Token: token}}, lease)
	if err != nil {
		return err
	}
	if !renewed[0] {
		return leaseLost("extend", queue, id)
	}
	return nil
}

// ExtendMany renews leases of claimed tasks of queue as Extend does, with one
// script call per 1,000 of them: a worker renews every lease it holds in a queue
// at once. renewed[i] reports leases[i]: false means its token no longer holds
// the task (the lease was lost) and that task is unchanged. Every lease and the
// duration are validated before anything is written; an error after that may
// leave earlier calls applied.
func (c *Client) ExtendMany(ctx context.Context, queue string, leases []Lease, lease time.Duration) (renewed []bool, err error) {
	k, err := c.Keys(queue)
	if err != nil {
		return nil, err
	}
	if err := checkLeases(leases); err != nil {
		return nil, err
	}
	if lease <= 0 || ms(lease) > maxMS {
		return nil, fmt.Errorf("%w: lease %v: must be positive", ErrInvalidArgument, lease)
	}
	if len(leases) == 0 {
		return nil, nil
	}
	return c.runLeases(ctx, c.s.extend, "extend", queue, []string{k.Active, k.TaskPrefix}, ms(lease), leases, parseExtend)
}

// checkLeases validates leases for a batch script: each with a valid id and token.
func checkLeases(leases []Lease) error {
	for _, l := range leases {
		if err := validate.TaskID(l.ID); err != nil {
			return err
		}
		if err := checkToken(l.Token); err != nil {
			return err
		}
	}
	return nil
}

// runLeases runs a batch script (complete, extend) over leases of queue, one call
// per maxComplete of them, each with first then the id, token pairs, and appends
// what parse reads of each reply: one bool per lease.
func (c *Client) runLeases(ctx context.Context, s *redis.Script, op, queue string, keys []string, first any,
	leases []Lease, parse func(dst []bool, v any, n int) ([]bool, error)) ([]bool, error) {
	out := make([]bool, 0, len(leases))
	args := make([]any, 0, 1+2*min(len(leases), maxComplete))
	for len(leases) > 0 {
		part := leases[:min(len(leases), maxComplete)]
		leases = leases[len(part):]
		args = append(args[:0], first)
		for _, l := range part {
			args = append(args, l.ID, l.Token)
		}
		v, err := c.run(ctx, s, keys, args...)
		if err != nil {
			if len(part) == 1 {
				return nil, fmt.Errorf("delayq: %s %s/%s: %w", op, queue, part[0].ID, err)
			}
			return nil, fmt.Errorf("delayq: %s %d tasks of %s: %w", op, len(part), queue, err)
		}
		if out, err = parse(out, v, len(part)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Complete marks a claimed task done: it leaves active and its hash stays as the
// dedupe record for Config.DoneRetention (payload removed), or is deleted when the
// retention is -1. ErrLeaseLost: the token no longer holds the task; nothing changed.
func (c *Client) Complete(ctx context.Context, queue, id, token string) error {
	done, err := c.CompleteMany(ctx, queue, []Lease{{ID: id, Token: token}})
	if err != nil {
		return err
	}
	if !done[0] {
		return leaseLost("complete", queue, id)
	}
	return nil
}

// CompleteMany completes claimed tasks of queue as Complete does, with one script
// call per 1,000 of them: a worker acknowledges every run that finished meanwhile
// at once. done[i] reports leases[i]: false means its token no longer holds the
// task (the lease was lost) and that task is unchanged. Every lease is validated
// before anything is written; an error after that may leave earlier calls applied.
func (c *Client) CompleteMany(ctx context.Context, queue string, leases []Lease) (done []bool, err error) {
	k, err := c.Keys(queue)
	if err != nil {
		return nil, err
	}
	if err := checkLeases(leases); err != nil {
		return nil, err
	}
	if len(leases) == 0 {
		return nil, nil
	}
	var ret int64
	if c.cfg.DoneRetention > 0 {
		ret = ms(c.cfg.DoneRetention)
	}
	return c.runLeases(ctx, c.s.complete, "complete", queue, []string{k.Active, k.TaskPrefix, k.History}, ret, leases,
		func(dst []bool, v any, n int) ([]bool, error) { return appendApplied(dst, v, "complete", n) })
}

// Retry gives a failed run back: the task is due again after delay (> 0, rounded up
// to a whole ms, by the Redis clock), or, when it has used MaxAttempts runs, it is
// dead (dead = true; mirror that into Postgres). lastErr is kept (cut to
// MaxErrorBytes). ErrLeaseLost: the token no longer holds the task; nothing changed.
func (c *Client) Retry(ctx context.Context, queue, id, token string, delay time.Duration, lastErr string) (dead bool, err error) {
	k, err := c.leaseArgs(queue, id, token)
	if err != nil {
		return false, err
	}
	if delay <= 0 || ms(delay) > maxMS {
		return false, fmt.Errorf("%w: retry delay %v: must be positive", ErrInvalidArgument, delay)
	}
	v, err := c.run(ctx, c.s.retry, []string{k.Ready, k.Active, k.Dead, k.TaskPrefix, k.Priority, k.Control},
		k.Wake, id, token, ms(delay), cutError(lastErr))
	if err != nil {
		return false, fmt.Errorf("delayq: retry %s/%s: %w", queue, id, err)
	}
	code, err := parseCode(v, "retry", 0, 1, 2)
	if err != nil {
		return false, err
	}
	if code == 0 {
		return false, leaseLost("retry", queue, id)
	}
	return code == 2, nil
}

// Kill moves a claimed task to dead at once, keeping lastErr (cut to
// MaxErrorBytes) and the payload. ErrLeaseLost: the token no longer holds the task.
func (c *Client) Kill(ctx context.Context, queue, id, token, lastErr string) error {
	k, err := c.leaseArgs(queue, id, token)
	if err != nil {
		return err
	}
	v, err := c.run(ctx, c.s.kill, []string{k.Active, k.Dead, k.TaskPrefix}, id, token, cutError(lastErr))
	if err != nil {
		return fmt.Errorf("delayq: kill %s/%s: %w", queue, id, err)
	}
	code, err := parseCode(v, "kill", 0, 1)
	if err != nil {
		return err
	}
	if code == 0 {
		return leaseLost("kill", queue, id)
	}
	return nil
}

// Release hands a lease back (worker shutdown): the task is due now again and the
// interrupted run is not counted. ErrLeaseLost: the token no longer holds the task.
func (c *Client) Release(ctx context.Context, queue, id, token string) error {
	return c.ReleaseAfter(ctx, queue, id, token, 0)
}

// ReleaseAfter is Release with the task due after delay (Redis clock, rounded up
// to a whole ms) instead of now: a run that snoozed. The run is not
// counted.
func (c *Client) ReleaseAfter(ctx context.Context, queue, id, token string, delay time.Duration) error {
	k, err := c.leaseArgs(queue, id, token)
	if err != nil {
		return err
	}
	if delay < 0 || ms(delay) > maxMS {
		return fmt.Errorf("%w: release delay %v: must not be negative", ErrInvalidArgument, delay)
	}
	v, err := c.run(ctx, c.s.release, []string{k.Ready, k.Active, k.TaskPrefix, k.Priority, k.Control}, k.Wake, id, token, ms(delay))
	if err != nil {
		return fmt.Errorf("delayq: release %s/%s: %w", queue, id, err)
	}
	code, err := parseCode(v, "release", 0, 1)
	if err != nil {
		return err
	}
	if code == 0 {
		return leaseLost("release", queue, id)
	}
	return nil
}

// Reap takes back up to limit expired leases of queue (Redis clock): tasks with runs
// left return to ready after a backoff (Config.ReapBackoffBase/Max), the others go to
// dead with the error "lease expired" (mirror them into Postgres). Members of active
// without an active task hash are dropped and reported as orphans.
func (c *Client) Reap(ctx context.Context, queue string, limit int) (ReapResult, error) {
	k, err := c.Keys(queue)
	if err != nil {
		return ReapResult{}, err
	}
	if limit < 1 || limit > maxReap {
		return ReapResult{}, fmt.Errorf("%w: reap limit %d: 1..%d", ErrInvalidArgument, limit, maxReap)
	}
	v, err := c.run(ctx, c.s.reap, []string{k.Ready, k.Active, k.Dead, k.TaskPrefix, k.Priority, k.Control},
		k.Wake, limit, ms(c.cfg.ReapBackoffBase), ms(c.cfg.ReapBackoffMax), mrand.IntN(1_000_000), ms(ExhaustedHold))
	if err != nil {
		return ReapResult{}, fmt.Errorf("delayq: reap %s: %w", queue, err)
	}
	return parseReap(v)
}

// LeaseExpiredError is the last error of a task whose last lease expired, when its
// runs recorded none.
const LeaseExpiredError = "lease expired"

// ExhaustedHold is how long Reap keeps an exhausted task's revoked lease before it
// reports the task again: the time its caller has to settle it.
const ExhaustedHold = 10 * time.Second

// Remove deletes a task in any state, with its dedupe record, and reports whether
// anything existed. A worker holding its lease gets ErrLeaseLost afterwards.
func (c *Client) Remove(ctx context.Context, queue, id string) (removed bool, err error) {
	k, err := keysForTask(c.cfg.Prefix, queue, id)
	if err != nil {
		return false, err
	}
	v, err := c.run(ctx, c.s.remove, []string{k.Ready, k.Active, k.Dead, k.TaskPrefix, k.Priority}, id)
	if err != nil {
		return false, fmt.Errorf("delayq: remove %s/%s: %w", queue, id, err)
	}
	code, err := parseCode(v, "remove", 0, 1)
	return code == 1, err
}

// Stats reads the counts of queue in one atomic step on the Redis clock.
func (c *Client) Stats(ctx context.Context, queue string) (Stats, error) {
	k, err := c.Keys(queue)
	if err != nil {
		return Stats{}, err
	}
	v, err := c.run(ctx, c.s.stats, []string{k.Ready, k.Active, k.Dead})
	if err != nil {
		return Stats{}, fmt.Errorf("delayq: stats %s: %w", queue, err)
	}
	return parseStats(v)
}

// Overdue counts the ready tasks of queue due more than after ago by the Redis
// clock: due, and not claimed for that long.
func (c *Client) Overdue(ctx context.Context, queue string, after time.Duration) (int64, error) {
	k, err := c.Keys(queue)
	if err != nil {
		return 0, err
	}
	now, err := c.rdb.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("delayq: overdue %s: %w", queue, err)
	}
	n, err := c.rdb.ZCount(ctx, k.Ready, "-inf", "("+formatScore(now.Add(-after))).Result()
	if err != nil {
		return 0, fmt.Errorf("delayq: overdue %s: %w", queue, err)
	}
	return n, nil
}

// Inspect reads up to 1000 tasks of queue in one atomic step, in the order of ids.
// Tasks that do not exist come back with State StateMissing.
func (c *Client) Inspect(ctx context.Context, queue string, ids ...string) ([]TaskInfo, error) {
	k, err := c.Keys(queue)
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, nil
	}
	if len(ids) > maxInspect {
		return nil, fmt.Errorf("%w: inspect %d ids, at most %d", ErrInvalidArgument, len(ids), maxInspect)
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		if err := validate.TaskID(id); err != nil {
			return nil, err
		}
		args[i] = id
	}
	v, err := c.run(ctx, c.s.inspect, []string{k.Ready, k.Active, k.Dead, k.TaskPrefix}, args...)
	if err != nil {
		return nil, fmt.Errorf("delayq: inspect %s: %w", queue, err)
	}
	return parseInspect(v, ids)
}
