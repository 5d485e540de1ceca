package outbox

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
)

// Task is one task to enqueue.
//
// When it runs: Delay after the enqueue (measured on the database clock), or at RunAt.
// Set one of them, not both. Leaving both zero means "now": the zero time.Time cannot be
// told apart from "not set", so a RunAt left zero is never an error, while a RunAt at or
// before the Unix epoch (what an unset Unix timestamp turns into) is.
type Task struct {
	// Queue names the queue: 1..64 bytes of [A-Za-z0-9_.-].
	Queue string
	// ID is the business identity of the task within its queue, e.g. "order-1001":
	// 1..200 bytes of printable ASCII without '{' or '}'. (Queue, ID) is unique for as
	// long as the row is kept: a second enqueue is reported as a duplicate.
	ID string
	// Payload is handed to the worker as is. At most Config.MaxPayloadBytes (64 KiB by
	// default). nil is stored as an empty payload. Queue[T] encodes
	// a typed value (JSON by default).
	Payload []byte
	// Delay postpones the task from the time of the enqueue. Must not be negative.
	Delay time.Duration
	// RunAt is the earliest execution time. A time in the past means "now".
	RunAt time.Time
	// MaxAttempts bounds the executions before the task is dead. 0 means
	// Config.DefaultMaxAttempts (25 by default); negative is an error.
	MaxAttempts int
	// TraceContext is stored with the task and handed to its worker (Task's
	// TraceContext there), opaque to delayq: at most 512 bytes of printable ASCII.
	// Empty means Config.TraceContext's, if set, else none.
	TraceContext string
	// StartBy, when set, is the latest time the task may start (any attempt),
	// by the Redis clock, to the millisecond: a task that cannot start by then
	// (a backlog, an outage, retries) is not run late but made dead with the
	// reason, and handed to the queue's OnMissedDeadline hook (worker) in the
	// same transaction, exactly once. Zero: no deadline. Must not be before the
	// due time: RunAt, or now plus Delay on the database clock (checked by the
	// insert), and not past.
	StartBy time.Time
	// Priority orders the tasks of the queue that are already due: 0..9, higher
	// first; 0, the default, is the lowest (as the weights of worker.Prioritize:
	// more is sooner). Among due tasks of one priority the earlier due time goes
	// first. It never makes a task start before it is due, and the order is
	// strict: a constant backlog of higher priorities starves the lower ones of
	// the queue. Kept by Reschedule and by a retry from dead.
	Priority int
	// ConcurrencyKey names what the task's runs count against (a tenant, an
	// account): "" for none, else 1..200 bytes of UTF-8 without control
	// characters. While the task's queue caps the runs of one key at once or
	// throttles its starts (delayq.Client.SetKeyLimits, `delayq queue keys`),
	// the claim lets a task start only within them, across every worker; a
	// queue without limits ignores it. Kept by Reschedule and by a retry from
	// dead. README: "Concurrency keys and throttles".
	ConcurrencyKey string

	// Replace sets the conflict policy "replace": when a task of this queue and id
	// exists and has yet to start (pending, queued and not yet due, or waiting on
	// its dependencies), the enqueue gives it this task's Payload and due time
	// (Delay or RunAt; both zero: now) as a new version, in the caller's
	// transaction, instead of reporting a duplicate: Result.Replaced. Its other
	// fields (MaxAttempts, Priority, TraceContext, StartBy, attempts so far) are
	// kept. A queued task's copy in Redis is replaced by the relay as after
	// Reschedule. A task due and queued (a worker may be running it) is refused
	// with ErrRunning, nothing written; a finished one (done, dead, cancelled)
	// is a duplicate. Not with StartBy, nor in EnqueueMany (ErrInvalidTask).
	Replace bool
	// KeepRunAt, with Replace, keeps the existing task's due time (the first
	// enqueue's, or its last reschedule's): only the payload is replaced.
	KeepRunAt bool
	// Debounce sets the conflict policy "debounce" with this window: the task is
	// due Debounce after the enqueue (on the database clock; set no Delay or
	// RunAt), and an enqueue of the same key while it has yet to start replaces
	// its payload and pushes its due time back to Debounce after this enqueue
	// (never earlier than it was), capped by MaxWait: Result.Debounced. The
	// states are Replace's. At least a microsecond when set.
	Debounce time.Duration
	// MaxWait, with Debounce, caps the due time at MaxWait after the first
	// enqueue of the key (its row's created_at: that transaction's start), so a
	// steady stream of enqueues cannot postpone the task forever. At least
	// Debounce; zero: no cap.
	MaxWait time.Duration

	// payloadType is the type of the value Queue.Task encoded (nil for raw
	// bytes): the client refuses another for the same queue name
	// (ErrQueueType). Not stored.
	payloadType reflect.Type
}

// maxStartByMS is the latest start deadline Redis keeps (Unix ms, the scripts'
// bound).
const maxStartByMS = 1e14

var (
	minRunAt = time.Unix(0, 0)
	maxRunAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
)

// Validate checks t as Enqueue would, without touching the database. The error wraps
// one of ErrInvalidQueue, ErrInvalidTaskID, ErrInvalidTask (naming the field, or
// the conflict policy's fields: Replace, KeepRunAt, Debounce, MaxWait) or
// ErrPayloadTooLarge.
func (c *Client) Validate(t Task) error {
	if err := validate.Queue(t.Queue); err != nil {
		return err
	}
	if err := validate.TaskID(t.ID); err != nil {
		return err
	}
	if t.Delay < 0 {
		return fmt.Errorf("%w: %v is negative", validate.ErrInvalidDelay, t.Delay)
	}
	if !t.RunAt.IsZero() {
		if t.Delay != 0 {
			return fmt.Errorf("%w: both Delay (%v) and RunAt (%v) are set; set one", validate.ErrInvalidRunAt, t.Delay, t.RunAt)
		}
		if err := checkRunAt(t.RunAt); err != nil {
			return err
		}
	}
	if !t.StartBy.IsZero() {
		if !t.StartBy.After(minRunAt) || t.StartBy.UnixMilli() > maxStartByMS {
			return fmt.Errorf("%w: %v is out of range", validate.ErrInvalidStartBy, t.StartBy.UTC())
		}
		if !t.RunAt.IsZero() && t.StartBy.Before(t.RunAt) {
			return fmt.Errorf("%w: %v is before RunAt %v: the task could never start", validate.ErrInvalidStartBy, t.StartBy.UTC(), t.RunAt.UTC())
		}
	}
	if limit := c.cfg.MaxPayloadBytes; len(t.Payload) > limit {
		return fmt.Errorf("%w: %d bytes, at most %d (Config.MaxPayloadBytes)", ErrPayloadTooLarge, len(t.Payload), limit)
	}
	if t.MaxAttempts < 0 || t.MaxAttempts > validate.MaxAttempts {
		return fmt.Errorf("%w: %d: 1..%d (0 means the default, %d)", validate.ErrInvalidMaxAttempts, t.MaxAttempts, validate.MaxAttempts, c.cfg.DefaultMaxAttempts)
	}
	if err := validate.TraceContext(t.TraceContext); err != nil {
		return err
	}
	if err := validate.Priority(t.Priority); err != nil {
		return err
	}
	if err := validate.ConcurrencyKey(t.ConcurrencyKey); err != nil {
		return err
	}
	return checkConflict(t)
}

// checkConflict checks the conflict policy of t: Replace (with KeepRunAt) or
// Debounce (with MaxWait), one of them.
func checkConflict(t Task) error {
	switch {
	case !t.Replace && t.KeepRunAt:
		return fmt.Errorf("%w: KeepRunAt without Replace", validate.ErrInvalidConflict)
	case t.Debounce < 0 || t.Debounce > 0 && t.Debounce < time.Microsecond:
		return fmt.Errorf("%w: Debounce %v: at least 1µs, or 0 for none", validate.ErrInvalidConflict, t.Debounce)
	case t.MaxWait < 0:
		return fmt.Errorf("%w: MaxWait %v is negative", validate.ErrInvalidConflict, t.MaxWait)
	case t.MaxWait > 0 && t.Debounce == 0:
		return fmt.Errorf("%w: MaxWait %v without Debounce", validate.ErrInvalidConflict, t.MaxWait)
	case t.MaxWait > 0 && t.MaxWait < t.Debounce:
		return fmt.Errorf("%w: MaxWait %v is shorter than Debounce %v", validate.ErrInvalidConflict, t.MaxWait, t.Debounce)
	case t.Replace && t.Debounce > 0:
		return fmt.Errorf("%w: both Replace and Debounce are set; set one", validate.ErrInvalidConflict)
	case t.Debounce > 0 && (t.Delay != 0 || !t.RunAt.IsZero()):
		return fmt.Errorf("%w: Debounce %v with a Delay or RunAt: the window is the delay", validate.ErrInvalidConflict, t.Debounce)
	case (t.Replace || t.Debounce > 0) && !t.StartBy.IsZero():
		return fmt.Errorf("%w: a start deadline (StartBy) with Replace or Debounce", validate.ErrInvalidConflict)
	}
	return nil
}

// conflict is t's policy for EnqueueReplace, 0 for none (a duplicate).
func (t *Task) conflict() int16 {
	switch {
	case t.Debounce > 0:
		return taskstate.ConflictDebounce
	case t.Replace && t.KeepRunAt:
		return taskstate.ConflictKeepRunAt
	case t.Replace:
		return taskstate.ConflictReplace
	}
	return 0
}

func checkRunAt(t time.Time) error {
	if !t.After(minRunAt) {
		return fmt.Errorf("%w: %s is at or before the Unix epoch (an unset timestamp?)", validate.ErrInvalidRunAt, t.UTC().Format(time.RFC3339Nano))
	}
	if !t.Before(maxRunAt) {
		return fmt.Errorf("%w: %s is after the year 9999", validate.ErrInvalidRunAt, t.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// row is a validated task as the SQL takes it.
type row struct {
	queue, id   string
	runAt       *time.Time // nil: now + delayUS on the database clock
	delayUS     int64
	payload     []byte // never nil: pgx would send NULL
	maxAttempts int32
	trace       *string    // nil: none (NULL)
	startBy     *time.Time // nil: none
	priority    int16
	key         *string // nil: none (NULL)
}

// row makes the row of t, enqueued with ctx.
func (c *Client) row(ctx context.Context, t Task) row {
	r := row{
		queue:       t.Queue,
		id:          t.ID,
		delayUS:     t.Delay.Microseconds(),
		payload:     t.Payload,
		maxAttempts: int32(t.MaxAttempts),
		priority:    int16(t.Priority),
	}
	if t.ConcurrencyKey != "" {
		k := t.ConcurrencyKey
		r.key = &k
	}
	if !t.RunAt.IsZero() {
		at := t.RunAt
		r.runAt = &at
	}
	if !t.StartBy.IsZero() {
		sb := t.StartBy
		r.startBy = &sb
	}
	if r.payload == nil {
		r.payload = []byte{}
	}
	if r.maxAttempts == 0 {
		r.maxAttempts = int32(c.cfg.DefaultMaxAttempts)
	}
	tc := t.TraceContext
	if tc == "" && c.cfg.TraceContext != nil {
		if tc = c.cfg.TraceContext(ctx); validate.TraceContext(tc) != nil {
			tc = "" // tracing never fails an enqueue
		}
	}
	if tc != "" {
		r.trace = &tc
	}
	return r
}
