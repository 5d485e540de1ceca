// Package queuectl owns the queue controls on both stores: the pause, the rate
// limit, the shard count and the limits per concurrency key of a queue. Postgres (delayq_queues, through
// taskstate's statements) is their truth; Redis holds a copy keyed by the row's
// version, which the claim and enqueue scripts read.
//
// Each change is one operation that commits the new controls in Postgres,
// bumping the version, and then writes Redis's copy with that version. Redis's
// copy is written only here: by those operations and by Restore, the relay's
// repair of it (its control sync, and reconcile). Because Redis takes a write
// only over an older version, the operations and the repair may race in any
// order and Redis ends at Postgres's newest version. (A queue's weight is no
// control: it is a worker's PriorityGroup setting, stored nowhere.)
package queuectl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
)

// SyncInterval is how often the relay writes the queue controls (pause,
// rate limit, shard count) from Postgres into Redis's copy. The control
// operations (package control, the CLI, the dashboard) write both stores
// themselves; this sync is their repair: it restores a Redis write that failed
// (control.ErrNotMirrored), or a Redis that lost its data. Each write is keyed by
// the controls' version, so it never undoes a newer change.
const SyncInterval = 2 * time.Second

// Control is one queue's controls as Postgres holds them, with their version.
type Control = taskstate.QueueControl

// ErrNotMirrored reports a change committed in Postgres whose write into Redis
// failed: the change stands (Postgres is the truth) and the relay's control sync
// writes it into Redis within SyncInterval. The operation returns
// the committed controls with it.
var ErrNotMirrored = errors.New("committed in PostgreSQL, not yet in Redis")

// ErrTransaction reports a pgx.Tx given as the database: the operation commits
// its own statement, and writes Redis after that commit, which a caller's
// transaction would hold back (Redis would hold a version Postgres may never
// commit, or reuse for other controls).
var ErrTransaction = errors.New("the controls' operations need a pool or a connection, not a transaction")

// Controller runs the control operations on one database and one Redis.
type Controller struct {
	db    taskstate.Querier
	dq    *dispatch.Client
	store *taskstate.Store
}

// New returns a Controller writing db (a pool or a connection outside a
// transaction) in schema ("" is public) and then dq.
func New(db taskstate.Querier, dq *dispatch.Client, schema string) (*Controller, error) {
	if db == nil || dq == nil {
		return nil, errors.New("queuectl: a database and a delayq client are required")
	}
	if _, ok := db.(pgx.Tx); ok {
		return nil, ErrTransaction
	}
	if schema == "" {
		schema = "public"
	}
	return &Controller{db: db, dq: dq, store: taskstate.New(taskstate.Config{Schema: schema})}, nil
}

// Pause pauses queue: from the next claim on, no worker claims from it. Tasks
// keep their due times; enqueues go on.
func (c *Controller) Pause(ctx context.Context, queue string) (Control, error) {
	return c.change(ctx, "pause", queue, func() (Control, error) { return c.store.SetPaused(ctx, c.db, queue, true) })
}

// Resume resumes queue and wakes its sleeping workers.
func (c *Controller) Resume(ctx context.Context, queue string) (Control, error) {
	return c.change(ctx, "resume", queue, func() (Control, error) { return c.store.SetPaused(ctx, c.db, queue, false) })
}

// SetRateLimit sets queue's rate limit (Limit 0 lifts it).
func (c *Controller) SetRateLimit(ctx context.Context, queue string, rate validate.RateLimit) (Control, error) {
	return c.change(ctx, "rate limit", queue, func() (Control, error) { return c.store.SetRateLimit(ctx, c.db, queue, rate) })
}

// SetKeyLimits sets queue's limits per concurrency key: concurrency runs of one
// key at once, throttle starts of one key in any window (0: none). A change
// puts the tasks parked for their keys back into ready, where the next claims
// judge them by the new limits.
func (c *Controller) SetKeyLimits(ctx context.Context, queue string, concurrency, throttle int, window time.Duration) (Control, error) {
	return c.change(ctx, "key limits", queue, func() (Control, error) {
		return c.store.SetKeyLimits(ctx, c.db, queue, concurrency, throttle, window)
	})
}

// SetShards sets queue's shard count (1..64). The count changes only while the
// queue is empty in both stores: Redis is asked first (ready, active and dead,
// over every shard: a task enqueued into Redis directly has no row), then the
// Postgres statement refuses while a row of the queue is pending, queued or dead;
// either refusal is a *NotEmptyError (taskstate.ErrQueueNotEmpty) and writes
// nothing. Setting the
// count the queue has already checks nothing and bumps nothing; its Redis write
// repairs a copy that lost the count.
func (c *Controller) SetShards(ctx context.Context, queue string, shards int) (Control, error) {
	return c.change(ctx, "shard count", queue, func() (Control, error) {
		if err := validate.Queue(queue); err != nil {
			return Control{}, fmt.Errorf("%w: %w", taskstate.ErrInvalidArgument, err)
		}
		if err := validate.Shards(shards); err != nil {
			return Control{}, fmt.Errorf("%w: %w", taskstate.ErrInvalidArgument, err)
		}
		cur, err := c.current(ctx, queue)
		if err != nil {
			return Control{}, err
		}
		if cur.Shards != shards {
			st, err := c.dq.Stats(ctx, queue)
			if err != nil {
				return Control{}, err
			}
			if held := st.Ready + st.Active + st.Dead; held > 0 {
				return Control{}, &NotEmptyError{Queue: queue, Shards: cur.Shards,
					Held: fmt.Sprintf("Redis holds %d of its tasks (%d ready, %d active, %d dead)", held, st.Ready, st.Active, st.Dead)}
			}
		}
		ctl, err := c.store.SetShards(ctx, c.db, queue, shards)
		if errors.Is(err, taskstate.ErrQueueNotEmpty) {
			return Control{}, &NotEmptyError{Queue: queue, Shards: cur.Shards, Held: "PostgreSQL holds pending, queued or dead tasks of it"}
		}
		return ctl, err
	})
}

// NotEmptyError reports a shard count refused because the queue has a task in
// either store; nothing was written. It is taskstate.ErrQueueNotEmpty.
type NotEmptyError struct {
	Queue string
	// Shards is the count the queue keeps; Held says which store holds what.
	Shards int
	Held   string
}

func (e *NotEmptyError) Error() string {
	return fmt.Sprintf("%s is not empty: %s; change the shard count only while the queue is empty (nothing written, still %d)",
		e.Queue, e.Held, e.Shards)
}

// Is makes errors.Is(err, taskstate.ErrQueueNotEmpty) hold.
func (e *NotEmptyError) Is(target error) bool { return target == taskstate.ErrQueueNotEmpty }

// List reads the controls of every queue that has a row, by name (a queue
// without one is unpaused, unlimited and of one shard).
func (c *Controller) List(ctx context.Context) ([]Control, error) {
	out, err := c.store.QueueControls(ctx, c.db)
	if err != nil {
		return nil, fmt.Errorf("queue controls: %w", err)
	}
	return out, nil
}

// current reads queue's controls (a queue without a row: 1 shard).
func (c *Controller) current(ctx context.Context, queue string) (Control, error) {
	ctls, err := c.store.QueueControls(ctx, c.db)
	if err != nil {
		return Control{}, err
	}
	for _, ctl := range ctls {
		if ctl.Queue == queue {
			return ctl, nil
		}
	}
	return Control{Queue: queue, Shards: 1}, nil
}

// change commits write's statement (alone, so it is committed when it returns)
// and then writes the controls it returned into Redis at their version.
func (c *Controller) change(ctx context.Context, what, queue string, write func() (Control, error)) (Control, error) {
	ctl, err := write()
	if err != nil {
		return Control{}, fmt.Errorf("queue controls: %s: %w", what, err)
	}
	if _, err := mirror(ctx, c.dq, ctl); err != nil {
		return ctl, fmt.Errorf("queue controls: %s of %s %w (version %d; the relay's control sync writes it within seconds): %w",
			what, queue, ErrNotMirrored, ctl.Version, err)
	}
	return ctl, nil
}

// mirror writes ctl into Redis at its version; applied is false when Redis holds
// it, or a newer one, already.
func mirror(ctx context.Context, dq *dispatch.Client, ctl Control) (applied bool, err error) {
	return dq.SetControls(ctx, ctl.Queue, ctl.Version, dispatch.Controls{Paused: ctl.Paused, Rate: ctl.Rate, Shards: ctl.Shards,
		KeyConcurrency: ctl.KeyConcurrency, KeyThrottle: ctl.KeyThrottle, KeyWindow: ctl.KeyWindow})
}

// Restore is the repair of Redis's copy: it writes every queue's controls from
// Postgres into Redis, each at its version, so it never undoes a newer change,
// and returns how many Redis was behind on (with dryRun, found and left). An
// outbox not migrated to 00004 has no controls: 0, nil. The relay runs it every
// SyncInterval, reconcile once per run.
func Restore(ctx context.Context, db taskstate.Querier, dq *dispatch.Client, schema string, dryRun bool) (int, error) {
	if schema == "" {
		schema = "public"
	}
	ctls, err := taskstate.New(taskstate.Config{Schema: schema}).QueueControls(ctx, db)
	if err != nil {
		if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "42P01" { // undefined_table
			return 0, nil
		}
		return 0, err
	}
	n := 0
	for _, c := range ctls {
		if dryRun {
			_, v, err := dq.Controls(ctx, c.Queue)
			if err != nil {
				return n, err
			}
			if v < c.Version {
				n++
			}
			continue
		}
		applied, err := mirror(ctx, dq, c)
		if err != nil {
			return n, err
		}
		if applied {
			n++
		}
	}
	return n, nil
}
