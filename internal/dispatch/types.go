package dispatch

import "time"

// Task is one task to put into Redis.
type Task struct {
	// ID is the business identity within the queue (validated, 1..200 bytes).
	ID string
	// Payload is opaque to delayq; at most Config.MaxPayloadBytes.
	Payload []byte
	// RunAt is the earliest execution time, kept to the millisecond. Zero means
	// now by the Redis clock.
	RunAt time.Time
	// MaxAttempts is how many runs the task gets before it is dead.
	// 0 means Config.DefaultMaxAttempts.
	MaxAttempts int
	// Attempt is the number of runs already used (0 for a new task; reconcile
	// passes the count recorded in Postgres).
	Attempt int
	// Version is the outbox version (0 means 1). A higher version replaces a task
	// that is still ready or active.
	Version int
	// TraceContext is the trace context of the enqueue, opaque to delayq (package
	// delayqotel writes and reads it), handed to the worker with the claim: at most
	// 512 bytes of printable ASCII; "" for none (the task hash then has no field
	// for it).
	TraceContext string
	// StartBy, when set, is the task's start deadline (kept to the millisecond,
	// rounded down): a claim after it does not run the task but reports it with
	// ClaimedTask.Missed, for the worker to settle. Zero: none (and no field in
	// the task hash).
	StartBy time.Time
	// Priority orders the queue's due tasks: 0..9, higher first (0, the default,
	// is the lowest). A task with a priority is kept in the task hash (field y) and
	// in the queue's priority index (Keys.Priority); one without costs nothing.
	Priority int
	// Key is the task's concurrency key ("" none, else 1..200 bytes; validate.
	// ConcurrencyKey): while the queue caps or throttles its keys, the claim
	// counts the task's run against it. Kept in the task hash (field k) only
	// when set.
	Key string
}

// EnqueueStatus tells what Enqueue did with one task.
type EnqueueStatus int

const (
	// Duplicate: the task hash already existed (ready, active, dead, or done within
	// the retention) and was left alone.
	Duplicate EnqueueStatus = iota
	// Added: the task is new and is now ready.
	Added
	// Replaced: a ready or active task with a lower version got the new due time,
	// payload and version; an active one lost its lease.
	Replaced
)

func (s EnqueueStatus) String() string {
	switch s {
	case Duplicate:
		return "duplicate"
	case Added:
		return "added"
	case Replaced:
		return "replaced"
	}
	return "EnqueueStatus(?)"
}

// Claim is the result of Client.Claim.
type Claim struct {
	// Tasks are the claimed tasks, in due order (ties in id order).
	Tasks []ClaimedTask
	// NextDue is how long until the earliest task still waiting falls due, by the
	// Redis clock, rounded up to a millisecond: 0 when more are due now, -1 when the
	// queue has no ready task. Pass it to Waiter.Wait.
	NextDue time.Duration
	// Now is the Redis clock at the claim, to the millisecond (of a sharded
	// queue: the latest of its shards' clocks, so that no task is due after it).
	Now time.Time
	// RateWait, when more tasks are due (NextDue 0) but the queue's rate limit
	// allows no further start now, is how long until it allows the next one
	// (rounded up to a millisecond); else 0. Pass it to Waiter.Wait.
	RateWait time.Duration

	// shards is the shard count the claimed shard's controls hold (0: none).
	shards int
}

// ClaimedTask is a task leased to one worker until LeaseUntil. Token proves the
// lease in Extend, Complete, Retry, Kill and Release.
type ClaimedTask struct {
	Queue   string
	ID      string
	Payload []byte
	// Attempt counts this run: 1 on the first.
	Attempt     int
	MaxAttempts int
	Version     int
	Token       string
	// Due is the time the task was due; Resumed, when the task fell due while
	// its queue was paused, the queue's resume after that (else zero). The claim
	// lateness is Claim.Now - the later of the two: paused time is no worker's.
	Due, Resumed time.Time
	// LeaseUntil is the lease deadline by the Redis clock.
	LeaseUntil time.Time
	// TraceContext is the one given at enqueue ("" for none).
	TraceContext string
	// StartBy is the task's start deadline (zero: none), and Missed tells that
	// the claim came after it, by the Redis clock: the task must not run; the
	// claim leased it only so that the worker settles it (dead, or handed to the
	// queue's missed-deadline hook), and it does not count against the queue's
	// rate limit.
	StartBy time.Time
	Missed  bool
}

// Lease names one claimed run of a task for CompleteMany: the task id and the
// token its claim handed out.
type Lease struct {
	ID    string
	Token string
}

// ReapResult lists what Client.Reap did.
type ReapResult struct {
	// Requeued went back to ready with a backoff.
	Requeued []string
	// Exhausted had used all attempts. They stay active with their leases
	// revoked for ExhaustedHold: the caller makes them dead in Postgres first, then
	// settles them in Redis (RepairIf: kill, or remove when Postgres says they
	// finished). Reap reports them again after the hold if nobody settled them.
	Exhausted []string
	// Orphans were in active without an active task hash; they were dropped.
	Orphans []string
}

// Stats are counts of one queue, read atomically on the Redis clock.
type Stats struct {
	Ready         int64 // tasks waiting, due or not
	DueNow        int64 // ready tasks due by now
	Active        int64 // leased tasks
	ExpiredLeases int64 // leased tasks past their deadline, not yet reaped
	Dead          int64
	// OldestLateness is how long the earliest ready task has been due (0 if none is).
	OldestLateness time.Duration
	// NextDue is the earliest due time in ready (zero when ready is empty).
	NextDue time.Time
	// Now is the Redis clock.
	Now time.Time
}

// State is where a task is in Redis.
type State string

// Task states, as Inspect reports them.
const (
	StateMissing State = "missing" // no task hash (never enqueued, removed, or retention over)
	StateReady   State = "ready"
	StateActive  State = "active"
	StateDone    State = "done"
	StateDead    State = "dead"
)

// TaskInfo is a read of one task hash.
type TaskInfo struct {
	ID          string
	State       State
	Payload     []byte // nil when done or missing
	Attempt     int    // 0 when done or missing
	MaxAttempts int    // 0 when done or missing
	Version     int    // 0 when done or missing
	LastError   string
	// Score: due time when ready, lease deadline when active, time of death when
	// dead; zero when done or missing.
	Score time.Time
	// TTL is the remaining retention of a done task (0 when none).
	TTL time.Duration
	// Priority is the task's priority within its queue (0..9, higher first).
	Priority int
}
