package outbox

import (
	"errors"

	"github.com/delayq/delayq/internal/notmigrated"
	"github.com/delayq/delayq/internal/validate"
)

// Errors of invalid input. Nothing is written when one is returned, also in EnqueueMany,
// where every task is checked before the statement is sent (and a start deadline
// against the due time by the statement, for the whole batch).
var (
	// ErrInvalidQueue reports a queue name that is empty, longer than 64 bytes or has a
	// character outside [A-Za-z0-9_.-]. It is the same value as delayq.ErrInvalidQueue.
	ErrInvalidQueue = validate.ErrInvalidQueue
	// ErrInvalidTaskID reports a task id that is empty, longer than 200 bytes or has a
	// byte outside printable ASCII, or '{' or '}'. It is the same value as
	// delayq.ErrInvalidTaskID.
	ErrInvalidTaskID = validate.ErrInvalidTaskID
	// ErrNotMigrated reports that one of delayq's tables, or the schema, does not
	// exist: the migrations have not run there (package migrations, or `delayq
	// migrate up`). Every call that reads or writes the tables returns an error
	// wrapping it, naming what is missing and ending with the hint (the
	// statement wrote nothing; a caller's transaction is aborted as by any
	// failed statement). CheckMigrated returns it, and so do the worker's and the
	// relay's Run at their start, instead of failing every round.
	ErrNotMigrated = notmigrated.Err
	// ErrQueueType reports a task built by a Queue whose payload type is not the
	// one the Client has seen for that queue name (see Queue).
	ErrQueueType = errors.New("queue used with another payload type")
	// ErrInvalidTask reports a task field out of its bounds: a negative Delay; a
	// RunAt at or before the Unix epoch (an unset timestamp), after the year 9999,
	// or given together with a Delay; a StartBy out of range or before the task's
	// due time (Validate checks the range and RunAt, the enqueue statement the
	// rest, writing nothing); a MaxAttempts below 0 (0 means the default) or above
	// 2^31-1; a TraceContext longer than 512 bytes or with a byte outside printable
	// ASCII; a Priority outside 0..9. The message names the field.
	ErrInvalidTask = validate.ErrInvalidTask
	// ErrPayloadTooLarge reports a payload larger than Config.MaxPayloadBytes.
	ErrPayloadTooLarge = errors.New("payload too large")
	// ErrInvalidConfig reports an invalid Config field, or an invalid argument to a
	// worker-side call (version, attempt).
	ErrInvalidConfig = errors.New("invalid outbox config")
)

// Errors of Cancel and Reschedule (and ErrRunning of an enqueue with a conflict
// policy).
var (
	// ErrNotFound reports that no task has this queue and id (or that the caller's
	// transaction cannot see it yet).
	ErrNotFound = errors.New("task not found")
	// ErrFinished reports that the task is done, dead or cancelled already, so it can
	// no longer be cancelled or rescheduled. Enqueue a new task id to run it again.
	ErrFinished = errors.New("task already finished")
	// ErrStale reports an edit of a dead task (RetryDeadEdited) that is no longer
	// the dead version the edit was made on: it was retried, purged and enqueued
	// again, or edited by someone else. Read it again and redo the edit.
	ErrStale = errors.New("task changed since it was read")
	// ErrRunning reports an enqueue with Replace or Debounce whose task is
	// queued and due: a worker may be running it, so it is not replaced under
	// the run. Nothing was written, and the caller's transaction is unharmed.
	// Enqueue another id (a generation suffix, say) to run it again after.
	ErrRunning = errors.New("task due and may be running")
)
