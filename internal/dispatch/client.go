package dispatch

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
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
	workerBeat, workerBye, workers *redis.Script
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
		{"workerbeat", &s.workerBeat}, {"workerbye", &s.workerBye}, {"workers", &s.workers},
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
	sh  shardCache
	// turn picks the shard a sharded queue's claim starts its share-out with.
	turn atomic.Uint32
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

// Enqueue adds tasks to queue and reports what happened to each (same order). A
// task whose hash exists is a Duplicate; see Task.Version for replacement. The
// tasks go in one pipelined round trip: one script call per shard of the queue
// and Config.EnqueueBatch tasks. All tasks are validated before anything is
// written; an error after that may leave some calls applied (repeating them is
// safe: they come back Duplicate).
func (c *Client) Enqueue(ctx context.Context, queue string, tasks ...Task) ([]EnqueueStatus, error) {
	if err := validate.Queue(queue); err != nil {
		return nil, err
	}
	for i, t := range tasks {
		if err := c.checkTask(t, c.cfg.MaxPayloadBytes); err != nil {
			return nil, fmt.Errorf("delayq: enqueue %s: task %d: %w", queue, i, err)
		}
	}
	if len(tasks) == 0 {
		return []EnqueueStatus{}, nil
	}
	out, err := c.enqueue(ctx, []QueueTasks{{Queue: queue, Tasks: tasks}}, false)
	if err != nil {
		return nil, err
	}
	return out[0], nil
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
	case validate.ConcurrencyKey(t.Key) != nil:
		return fmt.Errorf("%w: %q: %w", ErrInvalidTask, t.ID, validate.ConcurrencyKey(t.Key))
	}
	return nil
}

// Claim leases up to max due tasks of queue for lease (rounded up to a whole ms),
// by the Redis clock. With no task due, Claim.Tasks is empty and Claim.NextDue says
// how long to wait (see Waiter). A sharded queue's claim asks every shard in one
// pipelined round trip, max shared among them from a shard that turns with every
// call, so that each shard is drained at the same pace; due order holds within a
// shard, and across shards only as far as their backlogs are alike. The claim
// script reports the count shard 0 holds, so a Client whose count is stale learns
// the new one from that claim and claims the rest over the new layout at once.
func (c *Client) Claim(ctx context.Context, queue string, max int, lease time.Duration) (Claim, error) {
	if err := validate.Queue(queue); err != nil {
		return Claim{}, err
	}
	if max < 1 || max > maxClaim {
		return Claim{}, fmt.Errorf("%w: claim max %d: 1..%d", ErrInvalidArgument, max, maxClaim)
	}
	if lease <= 0 || ms(lease) > maxMS {
		return Claim{}, fmt.Errorf("%w: lease %v: must be positive", ErrInvalidArgument, lease)
	}
	l, err := c.shardsOf(ctx, queue)
	if err != nil {
		return Claim{}, err
	}
	cl, held, err := c.claim(ctx, queue, l, max, lease)
	if err != nil || held == 0 || held == len(l) {
		return cl, err
	}
	// Shard 0 holds another count than the one this claim was routed by: the
	// queue was split or merged (while empty) since this Client read it, and the
	// tasks due now may all be in shards the claim did not ask. Take the new
	// count and ask its layout at once, rather than sleep until ShardRefresh or
	// MaxWait (every shard wakes the queue's one channel, so the wake-up that
	// brought this claim is not lost).
	c.learnShards(queue, held)
	rest := max - len(cl.Tasks)
	if rest == 0 {
		return cl, nil
	}
	nl, err := c.layout(queue, held)
	if err != nil {
		return Claim{}, err
	}
	more, _, err := c.claim(ctx, queue, nl, rest, lease)
	if err != nil {
		if len(cl.Tasks) > 0 {
			cl.NextDue = 0 // leased already: hand them out, and claim again soon
			return cl, nil
		}
		return Claim{}, err
	}
	return mergeClaims([]Claim{cl, more}), nil
}

// claim runs one claim over the shards l of queue and returns it with the shard
// count that shard 0's controls hold (0: none).
func (c *Client) claim(ctx context.Context, queue string, l []Keys, max int, lease time.Duration) (Claim, int, error) {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	base := hex.EncodeToString(b[:])
	claimKeys := func(k Keys) []string {
		return []string{k.Ready, k.Active, k.TaskPrefix, k.Control, k.History, k.Priority, k.KeyPrefix}
	}
	if len(l) == 1 {
		v, err := c.run(ctx, c.s.claim, claimKeys(l[0]), max, ms(lease), base)
		if err != nil {
			return Claim{}, 0, fmt.Errorf("delayq: claim %s: %w", queue, err)
		}
		cl, err := parseClaim(v, queue)
		return cl, cl.shards, err
	}
	n := len(l)
	first := int(c.turn.Add(1) % uint32(n))
	calls := make([]scriptCall, n)
	for i := range n {
		k := (first + i) % n
		quota := max / n
		if i < max%n {
			quota++
		}
		calls[i] = scriptCall{keys: claimKeys(l[k]), args: []any{quota, ms(lease), tokenBase(base, k, n)}}
	}
	parts := make([]Claim, n)
	for i, cmd := range c.runPipelined(ctx, c.s.claim, calls, nil) {
		v, err := cmd.Result()
		if err != nil {
			return Claim{}, 0, fmt.Errorf("delayq: claim %s: shard %d of %d: %w", queue, (first+i)%n, n, err)
		}
		if parts[i], err = parseClaim(v, queue); err != nil {
			return Claim{}, 0, err
		}
	}
	return mergeClaims(parts), parts[(n-first)%n].shards, nil
}

// mergeClaims joins the claims of a queue's shards: the tasks in due order, the
// latest Now (each shard's script read the clock when it ran, so no task is due
// after the latest), the soonest NextDue of any shard, and the shortest RateWait
// of the shards with tasks due (0 if one of them could start more now).
func mergeClaims(parts []Claim) Claim {
	out := Claim{NextDue: -1, Now: parts[0].Now}
	rateWait := time.Duration(-1)
	for _, p := range parts {
		if p.Now.After(out.Now) {
			out.Now = p.Now
		}
		out.Tasks = append(out.Tasks, p.Tasks...)
		if p.NextDue >= 0 && (out.NextDue < 0 || p.NextDue < out.NextDue) {
			out.NextDue = p.NextDue
		}
		if p.NextDue == 0 && (rateWait < 0 || p.RateWait < rateWait) {
			rateWait = p.RateWait
		}
	}
	if out.NextDue == 0 {
		out.RateWait = rateWait
	}
	slices.SortFunc(out.Tasks, func(a, b ClaimedTask) int {
		if c := a.Due.Compare(b.Due); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

func checkToken(token string) error {
	if token == "" || len(token) > 100 {
		return fmt.Errorf("%w: lease token of %d bytes", ErrInvalidArgument, len(token))
	}
	return nil
}

// leaseArgs returns the keys of the shard holding the lease token of task id.
func (c *Client) leaseArgs(queue, id, token string) (Keys, error) {
	if err := validate.Queue(queue); err != nil {
		return Keys{}, err
	}
	if err := validate.TaskID(id); err != nil {
		return Keys{}, err
	}
	return c.leaseKeys(queue, token)
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
	if err := validate.Queue(queue); err != nil {
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
	return c.runLeases(ctx, c.s.extend, "extend", queue, func(k Keys) []string { return []string{k.Active, k.TaskPrefix} }, []any{ms(lease)}, leases, parseExtend)
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
// per shard the leases' tokens name and maxComplete of them, all in one pipelined
// round trip; each call takes first then the id, token pairs. It returns what
// parse reads of each reply: one bool per lease, in the order of leases.
func (c *Client) runLeases(ctx context.Context, s *redis.Script, op, queue string, keys func(Keys) []string, first []any,
	leases []Lease, parse func(dst []bool, v any, n int) ([]bool, error)) ([]bool, error) {
	type group struct {
		k   Keys
		pos []int
	}
	var groups []group // few: one per shard
	for i, l := range leases {
		k, err := c.leaseKeys(queue, l.Token)
		if err != nil {
			return nil, err
		}
		j := slices.IndexFunc(groups, func(g group) bool { return g.k == k })
		if j < 0 {
			groups = append(groups, group{k: k})
			j = len(groups) - 1
		}
		groups[j].pos = append(groups[j].pos, i)
	}
	var calls []scriptCall
	var at [][]int
	for _, g := range groups {
		for start := 0; start < len(g.pos); start += maxComplete {
			part := g.pos[start:min(start+maxComplete, len(g.pos))]
			args := make([]any, 0, len(first)+2*len(part))
			args = append(args, first...)
			for _, i := range part {
				args = append(args, leases[i].ID, leases[i].Token)
			}
			calls = append(calls, scriptCall{keys: keys(g.k), args: args})
			at = append(at, part)
		}
	}
	var replies []any
	if len(calls) == 1 {
		v, err := c.run(ctx, s, calls[0].keys, calls[0].args...)
		if err != nil {
			return nil, leasesErr(op, queue, leases, at[0], err)
		}
		replies = []any{v}
	} else {
		for i, cmd := range c.runPipelined(ctx, s, calls, nil) {
			v, err := cmd.Result()
			if err != nil {
				return nil, leasesErr(op, queue, leases, at[i], err)
			}
			replies = append(replies, v)
		}
	}
	out := make([]bool, len(leases))
	var one []bool
	for i, v := range replies {
		var err error
		if one, err = parse(one[:0], v, len(at[i])); err != nil {
			return nil, err
		}
		for j, p := range at[i] {
			out[p] = one[j]
		}
	}
	return out, nil
}

func leasesErr(op, queue string, leases []Lease, part []int, err error) error {
	if len(part) == 1 {
		return fmt.Errorf("delayq: %s %s/%s: %w", op, queue, leases[part[0]].ID, err)
	}
	return fmt.Errorf("delayq: %s %d tasks of %s: %w", op, len(part), queue, err)
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
	if err := validate.Queue(queue); err != nil {
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
	// The queue's one wake channel (every shard's): a completion that lets a task
	// parked for its concurrency key back into ready wakes the workers.
	wake := c.cfg.Prefix + ":{" + queue + "}:wake"
	return c.runLeases(ctx, c.s.complete, "complete", queue, func(k Keys) []string {
		return []string{k.Active, k.TaskPrefix, k.History, k.Ready, k.Priority, k.Control, k.KeyPrefix}
	}, []any{ret, wake}, leases,
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
	v, err := c.run(ctx, c.s.retry, []string{k.Ready, k.Active, k.Dead, k.TaskPrefix, k.Priority, k.Control, k.KeyPrefix},
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
	v, err := c.run(ctx, c.s.kill, []string{k.Active, k.Dead, k.TaskPrefix, k.Ready, k.Priority, k.Control, k.KeyPrefix},
		id, token, cutError(lastErr), k.Wake)
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
	v, err := c.run(ctx, c.s.release, []string{k.Ready, k.Active, k.TaskPrefix, k.Priority, k.Control, k.KeyPrefix}, k.Wake, id, token, ms(delay))
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

// Reap takes back up to limit expired leases of queue (of each shard; Redis clock): tasks with runs
// left return to ready after a backoff (Config.ReapBackoffBase/Max), the others go to
// dead with the error "lease expired" (mirror them into Postgres). Members of active
// without an active task hash are dropped and reported as orphans.
func (c *Client) Reap(ctx context.Context, queue string, limit int) (ReapResult, error) {
	if err := validate.Queue(queue); err != nil {
		return ReapResult{}, err
	}
	if limit < 1 || limit > maxReap {
		return ReapResult{}, fmt.Errorf("%w: reap limit %d: 1..%d", ErrInvalidArgument, limit, maxReap)
	}
	l, err := c.shardsOf(ctx, queue)
	if err != nil {
		return ReapResult{}, err
	}
	calls := make([]scriptCall, len(l))
	for i, k := range l {
		calls[i] = scriptCall{
			keys: []string{k.Ready, k.Active, k.Dead, k.TaskPrefix, k.Priority, k.Control, k.KeyPrefix},
			args: []any{k.Wake, limit, ms(c.cfg.ReapBackoffBase), ms(c.cfg.ReapBackoffMax), mrand.IntN(1_000_000), ms(ExhaustedHold)},
		}
	}
	var out ReapResult
	for _, v := range c.each(ctx, c.s.reap, calls) {
		if v.err != nil {
			return ReapResult{}, fmt.Errorf("delayq: reap %s: %w", queue, v.err)
		}
		r, err := parseReap(v.val)
		if err != nil {
			return ReapResult{}, err
		}
		out.Requeued = append(out.Requeued, r.Requeued...)
		out.Exhausted = append(out.Exhausted, r.Exhausted...)
		out.Orphans = append(out.Orphans, r.Orphans...)
	}
	return out, nil
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
	k, err := c.taskKeys(ctx, queue, id)
	if err != nil {
		return false, err
	}
	v, err := c.run(ctx, c.s.remove, []string{k.Ready, k.Active, k.Dead, k.TaskPrefix, k.Priority, k.Control, k.KeyPrefix}, id)
	if err != nil {
		return false, fmt.Errorf("delayq: remove %s/%s: %w", queue, id, err)
	}
	code, err := parseCode(v, "remove", 0, 1)
	return code == 1, err
}

// Stats reads the counts of queue in one atomic step on the Redis clock (one a
// shard, in one round trip, summed).
func (c *Client) Stats(ctx context.Context, queue string) (Stats, error) {
	l, err := c.shardsOf(ctx, queue)
	if err != nil {
		return Stats{}, err
	}
	calls := make([]scriptCall, len(l))
	for i, k := range l {
		calls[i] = scriptCall{keys: []string{k.Ready, k.Active, k.Dead, k.KeyPrefix}}
	}
	parts := make([]Stats, len(l))
	for i, v := range c.each(ctx, c.s.stats, calls) {
		if v.err != nil {
			return Stats{}, fmt.Errorf("delayq: stats %s: %w", queue, v.err)
		}
		if parts[i], err = parseStats(v.val); err != nil {
			return Stats{}, err
		}
	}
	return sumStats(parts), nil
}

// sumStats adds up the stats of a queue's shards.
func sumStats(parts []Stats) Stats {
	out := parts[0]
	for _, p := range parts[1:] {
		out.Ready += p.Ready
		out.DueNow += p.DueNow
		out.Active += p.Active
		out.ExpiredLeases += p.ExpiredLeases
		out.Dead += p.Dead
		out.OldestLateness = max(out.OldestLateness, p.OldestLateness)
		if !p.NextDue.IsZero() && (out.NextDue.IsZero() || p.NextDue.Before(out.NextDue)) {
			out.NextDue = p.NextDue
		}
	}
	return out
}

// Overdue counts the ready tasks of queue due more than after ago by the Redis
// clock: due, and not claimed for that long.
func (c *Client) Overdue(ctx context.Context, queue string, after time.Duration) (int64, error) {
	l, err := c.shardsOf(ctx, queue)
	if err != nil {
		return 0, err
	}
	now, err := c.rdb.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("delayq: overdue %s: %w", queue, err)
	}
	cmds := make([]*redis.IntCmd, len(l))
	_, err = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range l {
			cmds[i] = p.ZCount(ctx, k.Ready, "-inf", "("+formatScore(now.Add(-after)))
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("delayq: overdue %s: %w", queue, err)
	}
	var n int64
	for _, cmd := range cmds {
		n += cmd.Val()
	}
	return n, nil
}

// Inspect reads up to 1000 tasks of queue, in the order of ids: atomically in
// each shard, one script call a shard, in one round trip. Tasks that do not exist
// come back with State StateMissing.
func (c *Client) Inspect(ctx context.Context, queue string, ids ...string) ([]TaskInfo, error) {
	if err := validate.Queue(queue); err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, nil
	}
	if len(ids) > maxInspect {
		return nil, fmt.Errorf("%w: inspect %d ids, at most %d", ErrInvalidArgument, len(ids), maxInspect)
	}
	for _, id := range ids {
		if err := validate.TaskID(id); err != nil {
			return nil, err
		}
	}
	l, err := c.shardsOf(ctx, queue)
	if err != nil {
		return nil, err
	}
	out := make([]TaskInfo, len(ids))
	err = c.perShard(ctx, c.s.inspect, l, ids,
		func(k Keys) []string { return []string{k.Ready, k.Active, k.Dead, k.TaskPrefix} },
		func(v any, ids []string, pos []int) error {
			infos, err := parseInspect(v, ids)
			if err != nil {
				return err
			}
			for j, p := range pos {
				out[p] = infos[j]
			}
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("delayq: inspect %s: %w", queue, err)
	}
	return out, nil
}
