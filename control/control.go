// Package control changes a queue's controls — its pause, its rate limit and its
// shard count — each in one call that commits the change in PostgreSQL (the
// delayq_queues table, the truth, bumping the queue's version) and then writes
// Redis's copy of the controls, which the claim and enqueue scripts read, at that
// version:
//
//	queues, err := control.New(pool, ob, dq)
//	...
//	ctl, err := queues.Pause(ctx, "payment")
//
// A call takes a pool (or a connection outside a transaction), not the caller's
// transaction: Redis is written after Postgres's commit. If that Redis write
// fails, the change stands and the call returns it with ErrNotMirrored; the
// relay's control sync writes it into Redis within seconds. Redis takes a write
// only over an older version, so concurrent changes, and the relay's sync, end
// with Redis at Postgres's newest controls. Read the controls with List (Postgres)
// or delayq.Client.Controls (Redis's copy).
//
// A queue's weight is not a control: it is the worker's PriorityGroup setting.
package control

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// Control is a queue's controls as Postgres holds them: whether it is paused,
// its rate limit, its shard count, and the version Redis's copy is keyed by.
type Control = taskstate.QueueControl

// RateLimit caps a queue's starts across every worker: at most Limit per Period
// (default 1 s), up to Burst (default 1) at once; Limit 0 is no limit.
type RateLimit = validate.RateLimit

// DB is what the operations run on: a *pgxpool.Pool or a *pgx.Conn outside a
// transaction (a pgx.Tx is refused: ErrTransaction).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var (
	// ErrNotMirrored reports a change committed in Postgres whose write into Redis
	// failed: the change stands and is returned with the error, and the relay's
	// control sync (every 2s) writes it into Redis.
	ErrNotMirrored = queuectl.ErrNotMirrored
	// ErrTransaction reports a pgx.Tx given to New.
	ErrTransaction = queuectl.ErrTransaction
	// ErrQueueNotEmpty reports a shard count refused because the queue has a
	// task in Postgres (pending, queued or dead) or in Redis (ready, active or
	// dead): its tasks keep to the shards of the count they were moved with, so
	// the count changes only while the queue is empty. Nothing was written.
	ErrQueueNotEmpty = taskstate.ErrQueueNotEmpty
	// ErrInvalidQueue, ErrInvalidRateLimit and ErrInvalidShards report a bad
	// queue name, rate limit or shard count (1..delayq.MaxShards); nothing was
	// written. They are the values outbox and delayq report.
	ErrInvalidQueue     = validate.ErrInvalidQueue
	ErrInvalidRateLimit = validate.ErrInvalidRateLimit
	ErrInvalidShards    = validate.ErrInvalidShards
)

// Queues changes the controls of the queues of one outbox and one Redis.
type Queues struct{ c *queuectl.Controller }

// New returns the operations on db, in ob's schema, and on dq.
func New(db DB, ob *outbox.Client, dq *dispatch.Client) (*Queues, error) {
	if ob == nil {
		return nil, errors.New("control: an outbox client is required")
	}
	c, err := queuectl.New(db, dq, ob.Config().Schema)
	if err != nil {
		return nil, err
	}
	return &Queues{c: c}, nil
}

// Pause pauses queue: from the next claim on, no worker claims from it. Tasks
// keep their due times; enqueues go on. Pausing a paused queue bumps the version.
func (q *Queues) Pause(ctx context.Context, queue string) (Control, error) {
	return q.c.Pause(ctx, queue)
}

// Resume resumes queue and wakes its sleeping workers.
func (q *Queues) Resume(ctx context.Context, queue string) (Control, error) {
	return q.c.Resume(ctx, queue)
}

// SetRateLimit sets queue's rate limit (Limit 0 lifts it). A sharded queue's
// shards share it.
func (q *Queues) SetRateLimit(ctx context.Context, queue string, rate RateLimit) (Control, error) {
	return q.c.SetRateLimit(ctx, queue, rate)
}

// SetShards sets the number of shards queue's Redis keys are split into (1..64,
// delayq.MaxShards; 1, the default, is the unsharded layout). A task keeps to the
// shard of the count it was moved to Redis with, so the count changes only while
// the queue is empty in both stores: otherwise ErrQueueNotEmpty, and nothing is
// written. An enqueue that commits while the call runs is not seen: stop the
// queue's producers around a change to be safe. Setting the count the queue has
// already changes nothing, not even the version, also on a queue with tasks.
func (q *Queues) SetShards(ctx context.Context, queue string, shards int) (Control, error) {
	return q.c.SetShards(ctx, queue, shards)
}

// List reads from Postgres the controls of every queue ever paused, limited or
// sharded, by name.
func (q *Queues) List(ctx context.Context) ([]Control, error) {
	return q.c.List(ctx)
}
