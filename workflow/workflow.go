package workflow

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/notmigrated"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// MaxDependencies is the most dependencies one task waits on, and the most
// tasks one Chain enqueues.
const MaxDependencies = 100

var (
	// ErrCycle: a task named as its own dependency, twice in one chain or
	// batch, or a batch's callback among its children.
	ErrCycle = errors.New("workflow: cycle")
	// ErrTooManyDependencies: more than MaxDependencies, more than MaxBatch
	// children, or a workflow too large to cancel at once.
	ErrTooManyDependencies = errors.New("workflow: too many dependencies")
	// ErrUnknownDependency: a dependency has no row (never enqueued, enqueued
	// in another transaction not committed yet, or pruned by the retention).
	ErrUnknownDependency = errors.New("workflow: unknown dependency")
	// ErrInvalidPolicy: a Policy that is none of Fail, Skip and Run.
	ErrInvalidPolicy = errors.New("workflow: invalid policy")
)

// Policy says what a dependent does when a dependency ends dead or cancelled.
type Policy int

const (
	// Fail, the default: the dependent goes dead with the reason ("dependency
	// queue/id dead: its last error"), handed to its queue's OnDead hook.
	Fail Policy = iota
	// Skip: the dependent is cancelled with the reason.
	Skip
	// Run: the dependency counts as finished; the dependent runs.
	Run
)

// String returns the policy's name as the database stores it.
func (p Policy) String() string {
	switch p {
	case Fail:
		return "fail"
	case Skip:
		return "skip"
	case Run:
		return "run"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// Dependency names a task another one waits on, and what the waiting task does
// if it ends dead or cancelled.
type Dependency struct {
	Queue, ID string
	// OnFailure applies when the dependency ends dead or cancelled; Fail by
	// default.
	OnFailure Policy
}

// On returns the dependency on queue/id with the policy Fail.
func On(queue, id string) Dependency { return Dependency{Queue: queue, ID: id} }

// Result reports what one enqueue did.
type Result struct {
	outbox.Result
	// State is the new task's state: waiting, or pending when every dependency
	// had finished already, or dead or cancelled when one had failed as its
	// policy says. Empty for a duplicate.
	State delayqtype.State
}

// Client enqueues tasks with dependencies through an outbox client, in the
// caller's transaction. It is safe for concurrent use.
type Client struct {
	ob   *outbox.Client
	cfg  outbox.Config
	sql  taskstate.Statements
	deps *taskstate.Deps
}

// New returns a Client on p's outbox client (an *outbox.Client, or a
// *delayq.Client): the same schema, channel and task limits.
func New(p outbox.Producer) *Client {
	ob := p.Outbox()
	cfg := ob.Config()
	tc := taskstate.Config{
		Schema: cfg.Schema, NotifyChannel: cfg.NotifyChannel, NotifyWithin: cfg.NotifyWithin,
		ClearPayloadOnDone: cfg.ClearPayloadOnDone,
	}
	return &Client{ob: ob, cfg: cfg, sql: taskstate.NewStatements(tc), deps: taskstate.NewDepsReader(tc)}
}

// validTask checks t as ob.Validate does, and refuses a conflict policy
// (Replace, Debounce): the insert of a waiting task reports a duplicate;
// outbox.Client.Enqueue replaces a waiting task's payload and due time.
func validTask(ob *outbox.Client, t outbox.Task) error {
	if err := ob.Validate(t); err != nil {
		return err
	}
	if t.Replace || t.Debounce != 0 {
		return fmt.Errorf("%w: Replace and Debounce are outbox.Client.Enqueue's alone", validate.ErrInvalidConflict)
	}
	return nil
}

// Enqueue enqueues t in q, the caller's transaction, waiting on deps: it runs
// once every one of them finished (done; dead or cancelled as its OnFailure
// says), at t's own run time if that is later. With no deps it is an ordinary
// enqueue. A task whose (queue, id) exists is a duplicate: nothing is written,
// its dependencies untouched.
//
// Errors: t as outbox.Client.Validate says, and outbox.ErrInvalidTask for a
// conflict policy (Replace, Debounce: outbox.Client.Enqueue's alone); ErrCycle when t is among deps;
// ErrTooManyDependencies; ErrUnknownDependency (nothing written); ErrInvalidPolicy;
// outbox.ErrInvalidQueue or outbox.ErrInvalidTaskID for a dependency's key.
func (c *Client) Enqueue(ctx context.Context, q outbox.Querier, t outbox.Task, deps ...Dependency) (Result, error) {
	r, err := c.enqueue(ctx, q, t, deps)
	return r, notmigrated.Classify(err)
}

func (c *Client) enqueue(ctx context.Context, q outbox.Querier, t outbox.Task, deps []Dependency) (Result, error) {
	if err := validTask(c.ob, t); err != nil {
		return Result{}, fmt.Errorf("workflow: enqueue: %w", err)
	}
	deps, err := checkDeps(t, deps)
	if err != nil {
		return Result{}, fmt.Errorf("workflow: enqueue %s/%s: %w", t.Queue, t.ID, err)
	}
	dq, did, pol := make([]string, len(deps)), make([]string, len(deps)), make([]string, len(deps))
	for i, d := range deps {
		dq[i], did[i], pol[i] = d.Queue, d.ID, d.OnFailure.String()
	}
	a := c.args(ctx, t)
	var (
		runAt   *time.Time
		state   *string
		missing []int32
		written int64
		notes   int64
	)
	var key *string
	if t.ConcurrencyKey != "" {
		key = &t.ConcurrencyKey
	}
	err = q.QueryRow(ctx, c.sql.EnqueueWaiting, append(a, dq, did, pol, key)...).Scan(&runAt, &state, &missing, &written, &notes)
	if err != nil {
		return Result{}, fmt.Errorf("workflow: enqueue %s/%s: %w", t.Queue, t.ID, err)
	}
	if len(missing) > 0 {
		names := make([]string, len(missing))
		for i, m := range missing {
			names[i] = deps[m-1].Queue + "/" + deps[m-1].ID
		}
		return Result{}, fmt.Errorf("workflow: enqueue %s/%s: %w: %s (a dependency must be enqueued before its dependent, in this transaction or a committed one); nothing written",
			t.Queue, t.ID, ErrUnknownDependency, strings.Join(names, ", "))
	}
	if state == nil {
		return Result{Result: outbox.Result{Duplicate: true}}, nil
	}
	st, err := delayqtype.ParseState(*state)
	if err != nil {
		return Result{}, err
	}
	return Result{Result: outbox.Result{RunAt: *runAt}, State: st}, nil
}

// checkDeps validates deps for t and returns them without repeats (the first
// of a key given twice, its policy kept).
func checkDeps(t outbox.Task, deps []Dependency) ([]Dependency, error) {
	if len(deps) > MaxDependencies {
		return nil, fmt.Errorf("%w: %d, at most %d", ErrTooManyDependencies, len(deps), MaxDependencies)
	}
	out := make([]Dependency, 0, len(deps))
	for _, d := range deps {
		if err := errors.Join(validate.Queue(d.Queue), validate.TaskID(d.ID)); err != nil {
			return nil, fmt.Errorf("dependency %q/%q: %w", d.Queue, d.ID, err)
		}
		if d.OnFailure < Fail || d.OnFailure > Run {
			return nil, fmt.Errorf("dependency %s/%s: %w: %d", d.Queue, d.ID, ErrInvalidPolicy, int(d.OnFailure))
		}
		if d.Queue == t.Queue && d.ID == t.ID {
			return nil, fmt.Errorf("%w: the task waits on itself", ErrCycle)
		}
		if !slices.ContainsFunc(out, func(o Dependency) bool { return o.Queue == d.Queue && o.ID == d.ID }) {
			out = append(out, d)
		}
	}
	return out, nil
}

// args are the statement's parameters $1..$9 for t, as outbox writes them.
func (c *Client) args(ctx context.Context, t outbox.Task) []any {
	var runAt, startBy *time.Time
	if !t.RunAt.IsZero() {
		at := t.RunAt
		runAt = &at
	}
	if !t.StartBy.IsZero() {
		sb := t.StartBy
		startBy = &sb
	}
	payload := t.Payload
	if payload == nil {
		payload = []byte{}
	}
	ma := int32(t.MaxAttempts)
	if ma == 0 {
		ma = int32(c.cfg.DefaultMaxAttempts)
	}
	var trace *string
	tc := t.TraceContext
	if tc == "" && c.cfg.TraceContext != nil {
		if tc = c.cfg.TraceContext(ctx); validate.TraceContext(tc) != nil {
			tc = "" // tracing never fails an enqueue
		}
	}
	if tc != "" {
		trace = &tc
	}
	return []any{t.Queue, t.ID, runAt, t.Delay.Microseconds(), payload, ma, trace, startBy, int16(t.Priority)}
}

// Chain enqueues tasks in q, the caller's transaction, each waiting on the one
// before it: the first runs as an ordinary task (at its run time), each next
// one after the previous ended done, or as policy says when it ended dead or
// cancelled (Fail: the rest of the chain goes dead with the reason; Skip: it is
// cancelled; Run: it goes on). A task of the chain that exists already is a
// duplicate: the next one waits on the existing task. Results are in the
// order of tasks.
//
// Errors: as Enqueue's for each task; ErrCycle when a (queue, id) comes twice;
// ErrTooManyDependencies above MaxDependencies tasks. The caller rolls back
// the transaction on an error, as after any failed enqueue: the tasks before
// the one refused are written in it.
func (c *Client) Chain(ctx context.Context, q outbox.Querier, policy Policy, tasks ...outbox.Task) ([]Result, error) {
	if len(tasks) > MaxDependencies {
		return nil, fmt.Errorf("workflow: chain: %w: %d tasks, at most %d", ErrTooManyDependencies, len(tasks), MaxDependencies)
	}
	for i, t := range tasks {
		if err := validTask(c.ob, t); err != nil {
			return nil, fmt.Errorf("workflow: chain: task %d: %w", i, err)
		}
		for _, u := range tasks[:i] {
			if u.Queue == t.Queue && u.ID == t.ID {
				return nil, fmt.Errorf("workflow: chain: %w: %s/%s comes twice", ErrCycle, t.Queue, t.ID)
			}
		}
	}
	if policy < Fail || policy > Run {
		return nil, fmt.Errorf("workflow: chain: %w: %d", ErrInvalidPolicy, int(policy))
	}
	out := make([]Result, len(tasks))
	for i, t := range tasks {
		var deps []Dependency
		if i > 0 {
			deps = []Dependency{{Queue: tasks[i-1].Queue, ID: tasks[i-1].ID, OnFailure: policy}}
		}
		r, err := c.Enqueue(ctx, q, t, deps...)
		if err != nil {
			return nil, fmt.Errorf("workflow: chain: task %d: %w", i, err)
		}
		out[i] = r
	}
	return out, nil
}
