package delayq

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// WorkerConfig configures the worker of a Client (Config.Worker): its leases,
// shutdown, middleware and observers. The zero value means every default.
type WorkerConfig struct {
	// Lease is how long a claim holds a task: while it runs, no other worker gets
	// it. Heartbeats renew it; a worker that dies loses its tasks after the lease
	// plus one reap interval. The process's entry in the worker registry
	// (Client.Workers) is beaten every Lease/3 and shows the process lost a
	// Lease after its last beat. Default 5s; at least 1ms.
	Lease time.Duration

	// HeartbeatInterval is how often a running task's lease is renewed (to Lease
	// from then). Default Lease/3; a negative value turns heartbeats off (a handler
	// then has Lease to finish; tests use it). Must be below Lease.
	HeartbeatInterval time.Duration

	// ShutdownTimeout is how long Run, once its context is cancelled, lets the
	// handlers in flight finish before it cancels their contexts (cause
	// ErrShutdown) and gives their leases back. Default 30s; -1 cancels them at once.
	ShutdownTimeout time.Duration

	// OpTimeout bounds each bookkeeping call to Redis or Postgres: a claim, and the
	// completion, ack, retry or release after a handler returns. Default 10s.
	OpTimeout time.Duration

	// ErrorPause is the wait after a claim failed (Redis unreachable, say) before
	// the next attempt. Default 1s.
	ErrorPause time.Duration

	// DeadHookSweep is the longest wait between two sweeps of the deaths recorded
	// without their queue's OnDead hook (the reaper's, after a worker crashed on
	// the task's last attempt; the relay's, for a row Redis refuses), whose hooks
	// the sweep runs. A sweep also runs at start, when such a death of a queue
	// with a hook commits (the worker LISTENs on a connection of its own), and
	// when a failed hook's retry falls due: this is the backstop for
	// notifications lost behind a pooler in transaction mode, where LISTEN does
	// not work. Only a worker with an OnDead hook sweeps. Default 1m; -1: no
	// backstop.
	DeadHookSweep time.Duration

	// Logger receives failures, panics with their stacks and lost leases. Default:
	// discard.
	Logger *slog.Logger

	// Registerer, when set, gets the worker's Prometheus collectors (see package
	// doc): the Prometheus Observer. Workers and relays sharing one share the
	// collectors (counters add up). Default nil: no Prometheus metrics (Stats still
	// counts).
	Registerer prometheus.Registerer

	// OnError is called for every failed run (not for Snooze or Cancel), with
	// what the worker is about to do about it, before the failure is recorded:
	// report it, count it. It cannot change the outcome; a panic in it is
	// recovered and logged. Default nil.
	OnError func(ctx context.Context, t *Task, f Failure)

	// Middleware wraps the runs of every queue, outside each queue's own
	// (QueueConfig.Middleware); the first is the outermost. The worker's Recover is
	// always outside them. Default none.
	Middleware []Middleware

	// Observer, when set, receives the worker's claims and runs (tracing, custom
	// metrics); combine several with Observers. It is called after the Prometheus
	// observer. Default nil.
	Observer Observer
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c WorkerConfig) WithDefaults() WorkerConfig {
	if c.Lease == 0 {
		c.Lease = 5 * time.Second
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = c.Lease / 3
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = 10 * time.Second
	}
	if c.ErrorPause == 0 {
		c.ErrorPause = time.Second
	}
	if c.DeadHookSweep == 0 {
		c.DeadHookSweep = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Validate reports whether c, with its defaults, is a valid configuration (New
// does the same), so a command can reject bad flags before it connects.
func (c WorkerConfig) Validate() error { return c.WithDefaults().validate() }

func (c WorkerConfig) validate() error {
	switch {
	case c.Lease < time.Millisecond:
		return fmt.Errorf("%w: Lease %v: at least 1ms", ErrInvalidConfig, c.Lease)
	case c.HeartbeatInterval >= c.Lease:
		return fmt.Errorf("%w: HeartbeatInterval %v must be below Lease %v (negative turns heartbeats off)",
			ErrInvalidConfig, c.HeartbeatInterval, c.Lease)
	case c.HeartbeatInterval > 0 && c.HeartbeatInterval < time.Millisecond:
		return fmt.Errorf("%w: HeartbeatInterval %v: at least 1ms", ErrInvalidConfig, c.HeartbeatInterval)
	case c.ShutdownTimeout < 0 && c.ShutdownTimeout != -1:
		return fmt.Errorf("%w: ShutdownTimeout %v: positive, or -1", ErrInvalidConfig, c.ShutdownTimeout)
	case c.OpTimeout < time.Millisecond:
		return fmt.Errorf("%w: OpTimeout %v: at least 1ms", ErrInvalidConfig, c.OpTimeout)
	case c.ErrorPause < time.Millisecond:
		return fmt.Errorf("%w: ErrorPause %v: at least 1ms", ErrInvalidConfig, c.ErrorPause)
	case c.DeadHookSweep != -1 && c.DeadHookSweep < time.Millisecond:
		return fmt.Errorf("%w: DeadHookSweep %v: at least 1ms, or -1", ErrInvalidConfig, c.DeadHookSweep)
	}
	return checkMiddleware(c.Middleware)
}

func checkMiddleware(mws []Middleware) error {
	for i, mw := range mws {
		if mw == nil {
			return fmt.Errorf("%w: Middleware[%d] is nil", ErrInvalidConfig, i)
		}
	}
	return nil
}

// maxConcurrency is the most tasks one claim can lease (delayq's limit).
const maxConcurrency = 1000

// QueueConfig configures the handling of one queue. The zero value means every
// default.
type QueueConfig struct {
	// Concurrency is how many of the queue's handlers this worker runs at once; a
	// claim asks for as many tasks as there are free slots. A transactional run
	// holds its slot until its transaction committed (and each holds a Postgres
	// connection: size the pool accordingly); a plain run frees it when its handler
	// returns, and its completion is recorded in the background, in batches.
	// Default 10; 1..1000.
	Concurrency int

	// MaxAttempts caps the runs of the queue's tasks below their own max attempts
	// (set at enqueue, default 25): a run that fails at attempt MaxAttempts makes
	// the task dead. Default 0: the task's own limit.
	MaxAttempts int

	// Backoff is the delay before a failed task runs again. Default Base 1s,
	// Max 1h.
	Backoff Backoff

	// ClearPayload empties the task's payload in the outbox row when it is done, in
	// the transaction that marks it done, for payloads holding data that should not
	// outlive the task. (Redis drops the payload on completion anyway; dead tasks
	// keep theirs in both stores so a person can run them again.) Default false.
	ClearPayload bool

	// Retry decides, after the failed run number attempt (1 for the first),
	// whether the task runs again and after how long (at least 1ms): retry false
	// makes it dead. It is not asked when the handler said RetryAfter or NoRetry,
	// nor after the last attempt (the task is dead anyway). Default nil: the
	// Backoff, until the last attempt.
	Retry func(attempt int, err error) (delay time.Duration, retry bool)

	// OnDead runs in the transaction that records a task's death (see DeadHook).
	// Default nil.
	OnDead DeadHook
	// OnMissedDeadline runs in the transaction that records the death of a task
	// claimed after its start deadline (outbox.Task.StartBy), whose handler never
	// ran; its cause is a *MissedDeadlineError. Nil: OnDead runs instead, if set.
	// Either way the task is dead with the reason, exactly once.
	OnMissedDeadline DeadHook

	// Middleware wraps the runs of this queue's handler, inside the worker's
	// (Config.Middleware); the first is the outermost. Default none.
	Middleware []Middleware

	// GroupCommit commits several of the queue's transactional runs in one
	// Postgres transaction (see GroupCommit). Default: off, a transaction per run.
	GroupCommit GroupCommit
}

// maxGroupTasks (GroupCommit.MaxTasks' bound) is the most runs one group transaction holds: each run that
// writes is a subtransaction, and Postgres keeps the ids of 64 such
// subtransactions per transaction in shared memory; past them every snapshot
// taken anywhere in the database gets slower until the transaction ends
// (subtransaction overflow).
const maxGroupTasks = 64

// GroupCommit runs the handlers of several due tasks of a transactional queue in
// one Postgres transaction, one after another on one connection, each handler's
// writes inside a savepoint of its own, opened by its first statement. The
// completion guards of the group go in one statement with the COMMIT: a group of
// handlers that write nothing is one round trip. A handler that fails rolls back
// to its own savepoint only: that task is retried as in a transaction of its own,
// and the others commit together, with one commit (one disk flush) for the group.
// The guarantee is the same: a task's effect commits together with its
// completion, or not at all. When a guard refuses a task whose handler wrote (it
// finished, was cancelled or rescheduled while its handler ran), the group is
// rolled back and the other handlers that wrote run again without it, in the same
// attempt: a handler's effects outside Postgres may happen twice, as after a
// crash.
//
// Use it for short handlers whose writes do not hold contended locks: every row a
// handler locks stays locked until the whole group commits, up to MaxWait plus
// the handlers' time after the handler ran, and a task's completion waits for the
// handlers queued ahead of it in its group.
type GroupCommit struct {
	// MaxTasks is the most runs of one transaction; 0 turns group commit off.
	// Concurrency/MaxTasks groups (rounded up) run at once, each on a connection
	// of its own. 0..64: each run that writes is a subtransaction, and Postgres
	// keeps the ids of 64 per transaction in shared memory.
	MaxTasks int
	// MaxWait is how long a group takes more tasks after its first began; then
	// it commits. A group also commits at once when no other task can join it
	// (every slot of the queue is in a group). Default 2ms when MaxTasks is set.
	MaxWait time.Duration
}

func (g GroupCommit) enabled() bool { return g.MaxTasks > 0 }

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c QueueConfig) WithDefaults() QueueConfig {
	if c.Concurrency == 0 {
		c.Concurrency = 10
	}
	c.Backoff = c.Backoff.WithDefaults()
	if c.GroupCommit.enabled() && c.GroupCommit.MaxWait == 0 {
		c.GroupCommit.MaxWait = 2 * time.Millisecond
	}
	return c
}

// Validate reports whether c, with its defaults, is a valid queue configuration
// (Handle and HandleTx do the same).
func (c QueueConfig) Validate() error { return c.WithDefaults().validate() }

func (c QueueConfig) validate() error {
	switch {
	case c.Concurrency < 1 || c.Concurrency > maxConcurrency:
		return fmt.Errorf("%w: Concurrency %d: 1..%d", ErrInvalidConfig, c.Concurrency, maxConcurrency)
	case c.MaxAttempts < 0:
		return fmt.Errorf("%w: MaxAttempts %d: 0 (the task's own) or more", ErrInvalidConfig, c.MaxAttempts)
	case c.GroupCommit.MaxTasks < 0 || c.GroupCommit.MaxTasks > maxGroupTasks:
		return fmt.Errorf("%w: GroupCommit.MaxTasks %d: 0 (off) to %d", ErrInvalidConfig, c.GroupCommit.MaxTasks, maxGroupTasks)
	case c.GroupCommit.MaxWait < 0:
		return fmt.Errorf("%w: GroupCommit.MaxWait %v: not negative", ErrInvalidConfig, c.GroupCommit.MaxWait)
	}
	if err := checkMiddleware(c.Middleware); err != nil {
		return err
	}
	return c.Backoff.validate()
}

// Backoff is an exponential backoff with jitter. After the failed run number n
// (1 for the first run) the task waits d = min(Max, Base·2^(n-1)), jittered
// uniformly into [d/2, d] ("equal jitter": never less than half the policy, so
// retries of many tasks that failed together spread out without running early).
type Backoff struct {
	// Base is the delay after the first failure (before jitter). Default 1s.
	Base time.Duration
	// Max caps the delay. Default 1h; at least Base.
	Max time.Duration
}

// WithDefaults returns a copy of b with zero fields set to their defaults.
func (b Backoff) WithDefaults() Backoff {
	if b.Base == 0 {
		b.Base = time.Second
	}
	if b.Max == 0 {
		b.Max = time.Hour
	}
	return b
}

func (b Backoff) validate() error {
	switch {
	case b.Base < time.Millisecond:
		return fmt.Errorf("%w: Backoff.Base %v: at least 1ms", ErrInvalidConfig, b.Base)
	case b.Max < b.Base:
		return fmt.Errorf("%w: Backoff.Max %v below Backoff.Base %v", ErrInvalidConfig, b.Max, b.Base)
	}
	return nil
}

// Bounds returns the shortest and longest delay after the failed run number
// attempt (1 for the first run).
func (b Backoff) Bounds(attempt int) (lo, hi time.Duration) {
	b = b.WithDefaults()
	d := b.Max
	if attempt < 1 {
		attempt = 1
	}
	if attempt <= 62 {
		if x := b.Base << (attempt - 1); x>>(attempt-1) == b.Base && x > 0 && x < b.Max {
			d = x
		}
	}
	return d - d/2, d
}

// delay returns a random delay in Bounds(attempt).
func (b Backoff) delay(attempt int) time.Duration {
	lo, hi := b.Bounds(attempt)
	if hi <= lo {
		return lo
	}
	return lo + rand.N(hi-lo+1)
}
