package dispatch

import (
	"errors"

	"github.com/delayq/delayq/internal/validate"
)

var (
	// ErrInvalidQueue reports a bad queue name (same value as in outbox and validate).
	ErrInvalidQueue = validate.ErrInvalidQueue
	// ErrInvalidTaskID reports a bad task id (same value as in outbox and validate).
	ErrInvalidTaskID = validate.ErrInvalidTaskID
	// ErrInvalidPrefix reports a bad key prefix in Config.
	ErrInvalidPrefix = validate.ErrInvalidPrefix
	// ErrInvalidRateLimit reports a rate limit out of its bounds (same value as in
	// outbox and validate); the controls write wraps it in ErrInvalidArgument.
	ErrInvalidRateLimit = validate.ErrInvalidRateLimit

	// ErrInvalidConfig reports a Config that does not validate.
	ErrInvalidConfig = errors.New("delayq: invalid config")
	// ErrInvalidTask reports a task that cannot be enqueued (payload too large,
	// negative attempts, run time before 1970 ...). Nothing of the batch was written.
	ErrInvalidTask = errors.New("delayq: invalid task")
	// ErrInvalidArgument reports a bad call argument (claim size, lease, delay ...).
	ErrInvalidArgument = errors.New("delayq: invalid argument")
	// ErrLeaseLost reports a lease token that no longer holds its task: the lease
	// expired and was reaped, the task was rescheduled, removed or finished by
	// someone else. Nothing was changed.
	ErrLeaseLost = errors.New("delayq: lease lost")
	// ErrUnexpectedReply reports a script reply of an unexpected shape, e.g. from a
	// different version of the scripts.
	ErrUnexpectedReply = errors.New("delayq: unexpected reply from Redis")
	// ErrShardCount reports an enqueue routed by a queue's shard count as its
	// caller knows it (QueueTasks.Shards: Postgres's, for the relay) that a shard's
	// controls in Redis contradict. Nothing of that shard's call was written; the
	// caller brings the controls up to date (the relay mirrors them from Postgres)
	// and tries again.
	ErrShardCount = errors.New("delayq: shard count differs from the one Redis holds")
	// ErrClosed reports use of a closed Waiter.
	ErrClosed = errors.New("delayq: waiter closed")
)
