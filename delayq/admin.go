package delayq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/notmigrated"
	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// The operator's calls. Each writes PostgreSQL (the truth) first and Redis
// after, through the same operations as the worker and the relay (see
// docs/DESIGN.md, "Transitions"); a call that fails after its Postgres commit
// says so, and the relay or the next Reconcile brings Redis up to date.

// Pause stops every worker from claiming queue's tasks, from their next claim
// on. Tasks keep their due times and enqueues go on. A queue with no task yet
// can be paused.
func (c *Client) Pause(ctx context.Context, queue string) (delayqtype.QueueControl, error) {
	return classified(c.ctl.Pause(ctx, queue))
}

// Resume resumes queue and wakes its sleeping workers.
func (c *Client) Resume(ctx context.Context, queue string) (delayqtype.QueueControl, error) {
	return classified(c.ctl.Resume(ctx, queue))
}

// SetKeyLimits caps, across every worker, the runs of one concurrency key
// (outbox.Task.ConcurrencyKey) at once to concurrency, and its starts to
// throttle in any window (0 lifts either); tasks without a key are not limited.
// A task whose key is at a limit waits apart, without holding back other keys'
// tasks. README: "Concurrency keys and throttles".
func (c *Client) SetKeyLimits(ctx context.Context, queue string, concurrency, throttle int, window time.Duration) (delayqtype.QueueControl, error) {
	return classified(c.ctl.SetKeyLimits(ctx, queue, concurrency, throttle, window))
}

// SetRateLimit caps queue's starts across every worker (Limit 0 lifts the cap).
func (c *Client) SetRateLimit(ctx context.Context, queue string, rate delayqtype.RateLimit) (delayqtype.QueueControl, error) {
	return classified(c.ctl.SetRateLimit(ctx, queue, rate))
}

// SetShards splits queue's Redis keys into shards (1..64; 1 is the unsharded
// layout), for a queue too busy for one Redis Cluster node. The count changes
// only while the queue is empty in both stores.
func (c *Client) SetShards(ctx context.Context, queue string, shards int) (delayqtype.QueueControl, error) {
	return classified(c.ctl.SetShards(ctx, queue, shards))
}

// Queues lists the controls of every queue ever paused, limited or sharded.
func (c *Client) Queues(ctx context.Context) ([]delayqtype.QueueControl, error) {
	return classified(c.ctl.List(ctx))
}

// Cancel cancels the task (queue, id) if it has not finished: it will not run
// (a run in flight cannot record its completion), and its Redis copy is
// removed. To cancel inside your own transaction, use Outbox().Cancel.
func (c *Client) Cancel(ctx context.Context, queue, id string) error {
	if err := c.ob.Cancel(ctx, c.pool, queue, id); err != nil {
		return err // classified by outbox
	}
	if _, err := c.w.ops.RemoveFinished(ctx, c.pool, queue, id); err != nil {
		return fmt.Errorf("cancelled %s/%s in PostgreSQL; its Redis copy stays until the next reconcile: %w", queue, id, err)
	}
	return nil
}

// Reschedule moves the unfinished task (queue, id) to run at runAt, as a new
// version (the relay moves it to Redis). To reschedule inside your own
// transaction, use Outbox().Reschedule.
func (c *Client) Reschedule(ctx context.Context, queue, id string, runAt time.Time) error {
	return c.ob.Reschedule(ctx, c.pool, queue, id, runAt) // classified by outbox
}

// DeadTasks lists up to limit dead tasks of the queues given (none: every
// queue), the most recent deaths first.
func (c *Client) DeadTasks(ctx context.Context, limit int, queues ...string) ([]delayqtype.DeadTask, error) {
	return classified(reconcile.ListDead(ctx, c.pool, c.reconcileOptions(queues), limit))
}

// Attempts returns the attempt history of the task (queue, id), oldest first:
// each run that did not succeed with its outcome, error and, for a panic, its
// stack, and a done task's success (derived from its row; see
// delayqtype.Attempt for the bounds). The history is kept on the outbox row and
// deleted with it. No task: an error wrapping outbox.ErrNotFound.
func (c *Client) Attempts(ctx context.Context, queue, id string) ([]delayqtype.Attempt, error) {
	if err := errors.Join(validate.Queue(queue), validate.TaskID(id)); err != nil {
		return nil, err
	}
	b := taskstate.NewBrowser(taskstate.Config{Schema: c.cfg.Schema})
	t, ok, err := b.Task(ctx, c.pool, queue, id, 0)
	switch {
	case err != nil:
		return nil, fmt.Errorf("attempts of %s/%s: %w", queue, id, err)
	case !ok:
		return nil, fmt.Errorf("attempts of %s/%s: %w", queue, id, outbox.ErrNotFound)
	}
	return t.Attempts, nil
}

// RetryDead runs the dead task (queue, id) again: due now as a new version,
// its attempts reset.
func (c *Client) RetryDead(ctx context.Context, queue, id string) error {
	return notmigrated.Classify(reconcile.RetryDead(ctx, c.pool, c.reconcileOptions(nil), queue, id))
}

// RetryDeadEdited runs the dead task (queue, id) again with payload, only if
// it is still the dead version a person looked at (else outbox.ErrStale).
func (c *Client) RetryDeadEdited(ctx context.Context, queue, id string, version int, payload []byte) error {
	_, err := c.ob.RetryDeadEdited(ctx, c.pool, queue, id, version, payload)
	return err
}

// PurgeDead deletes the dead tasks of the queues given (none: every queue)
// from both stores, and returns how many.
func (c *Client) PurgeDead(ctx context.Context, queues ...string) (int, error) {
	return classified(reconcile.PurgeDead(ctx, c.pool, c.dq, c.reconcileOptions(queues)))
}

// Stats counts the tasks of the queues given (none: every queue) in both
// stores.
func (c *Client) Stats(ctx context.Context, queues ...string) ([]delayqtype.QueueStats, error) {
	return classified(reconcile.Stats(ctx, c.pool, c.dq, c.reconcileOptions(queues)))
}

// Check compares the two stores and returns what disagrees, changing nothing.
func (c *Client) Check(ctx context.Context, queues ...string) ([]delayqtype.Inconsistency, error) {
	return classified(reconcile.Check(ctx, c.pool, c.dq, c.reconcileOptions(queues)))
}

// Reconcile repairs Redis from PostgreSQL (after Redis lost data, say) for
// the queues given (none: every queue) and reports what it found and did.
// The relay heals a Redis that restarted empty by itself; this is the
// operator's explicit pass.
func (c *Client) Reconcile(ctx context.Context, queues ...string) (delayqtype.Report, error) {
	return classified(reconcile.Reconcile(ctx, c.pool, c.dq, c.reconcileOptions(queues)))
}

// classified passes a call's error through notmigrated.Classify: on a schema
// not migrated, every admin call's error wraps outbox.ErrNotMigrated and ends
// with the hint.
func classified[T any](v T, err error) (T, error) { return v, notmigrated.Classify(err) }

func (c *Client) reconcileOptions(queues []string) reconcile.Options {
	return reconcile.Options{Queues: queues, Schema: c.cfg.Schema, NotifyChannel: c.cfg.NotifyChannel, Logger: c.cfg.Logger}
}
