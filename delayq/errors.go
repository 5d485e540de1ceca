package delayq

import (
	"errors"
	"fmt"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
)

var (
	// ErrInvalidQueue reports a bad queue name (same value as in delayq, outbox and
	// validate).
	ErrInvalidQueue = validate.ErrInvalidQueue
	// ErrInvalidConfig reports a Config or QueueConfig that does not validate, a nil
	// dependency, or a queue registered twice.
	ErrInvalidConfig = errors.New("delayq: invalid config")
	// ErrNoHandlers reports Run with nothing to run: no handler registered (and,
	// on a Client, no Config.Relay).
	ErrNoHandlers = errors.New("delayq: no handlers registered")
	// ErrRunning reports a second Run, or a registration while Run is in progress.
	ErrRunning = errors.New("delayq: already running")

	// ErrNotMirrored reports a queue control (Pause, Resume, SetRateLimit,
	// SetShards) committed in PostgreSQL whose write into Redis failed: the change
	// stands and is returned with the error, and the relay writes it into Redis
	// within seconds.
	ErrNotMirrored = queuectl.ErrNotMirrored
	// ErrQueueNotEmpty reports a shard count refused because the queue has a task
	// in PostgreSQL or Redis: tasks keep to the shards they were moved with, so
	// the count changes only while the queue is empty. Nothing was written.
	ErrQueueNotEmpty = taskstate.ErrQueueNotEmpty

	// ErrLeaseLost is the cause (context.Cause) of a handler's context cancelled
	// because the worker no longer holds the task's lease: it expired and was
	// reaped, or the task was rescheduled or removed.
	ErrLeaseLost = dispatch.ErrLeaseLost
	// ErrShutdown is the cause (context.Cause) of a handler's context cancelled
	// because the worker is shutting down and WorkerConfig.ShutdownTimeout has passed.
	// The task's lease is given back and it runs again at once, elsewhere.
	ErrShutdown = errors.New("worker: shut down before the handler returned")
)

// retryAfterError is returned by RetryAfter: the task runs again after Delay
// instead of the queue's backoff. The run still counts as an attempt.
type retryAfterError struct {
	Delay time.Duration
	Err   error
}

// RetryAfter returns an error that makes the worker retry the task after d (at
// least 1ms) rather than after the queue's backoff. The run still counts against
// the task's max attempts. err is kept as the task's last error and may be nil.
func RetryAfter(d time.Duration, err error) error {
	return &retryAfterError{Delay: d, Err: err}
}

func (e *retryAfterError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("retry after %v", e.Delay)
	}
	return e.Err.Error()
}

func (e *retryAfterError) Unwrap() error { return e.Err }

// noRetryError is returned by NoRetry: the task is dead at once.
type noRetryError struct {
	Err error
}

// NoRetry returns an error that makes the task dead at once, whatever attempts it
// has left (a payload that can never succeed, for example). err is kept as the
// task's last error and may be nil. A dead task waits for a person.
func NoRetry(err error) error { return &noRetryError{Err: err} }

func (e *noRetryError) Error() string {
	if e.Err == nil {
		return "no retry"
	}
	return e.Err.Error()
}

func (e *noRetryError) Unwrap() error { return e.Err }
