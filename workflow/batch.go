package workflow

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/notmigrated"
	"github.com/delayq/delayq/outbox"
)

// MaxBatch is the most children one Batch enqueues.
const MaxBatch = 100_000

// cancelBound is the most tasks Cancel walks in a workflow of dependencies.
const cancelBound = 10_000

// BatchResult reports what Batch did.
type BatchResult struct {
	// Duplicate: the callback's key exists; nothing was written.
	Duplicate bool
	// Children is the number of children in the batch; Duplicates the
	// children whose key existed already, left out of it (the callback does
	// not wait on them, and they are not counted).
	Children, Duplicates int
	// RunAt is the callback's own run time: it runs then, or when the last
	// child finishes if that is later.
	RunAt time.Time
}

// BatchCounts is the progress of a batch, read from its counter rows (its
// shards' summed, migration 00030).
type BatchCounts struct {
	// Total is the number of children; Remaining those not finished yet;
	// Done, Dead and Cancelled how the others ended (each child counted once,
	// at its first finish: a dead child retried later is not counted again).
	Total, Remaining, Done, Dead, Cancelled int
	// CreatedAt is the enqueue's time; FinishedAt the time the last child
	// finished (zero while some remain).
	CreatedAt, FinishedAt time.Time
}

// Batch enqueues children and their callback in q, the caller's transaction,
// in one statement: the children as ordinary tasks, the callback waiting until
// every child has finished (done, dead or cancelled). The transition that
// finishes the last child — a worker's completion in the handler's own
// transaction, a death, a cancel — makes the callback pending in that same
// transaction, exactly once; it runs at its own run time if that is later. Its
// handler reads the counts with BatchCounts on its own queue and id.
//
// The callback's key names the batch: when it exists, nothing is written
// (Duplicate), so a batch is enqueued once however often the call is repeated.
// A child whose key exists is left out of the batch. With no child inserted
// the callback is pending at once.
//
// Errors: a task as outbox.Client.Validate says; ErrTooManyDependencies above
// MaxBatch children; ErrCycle when a child's key comes twice or is the
// callback's. The caller rolls back on an error, as after any failed enqueue.
func (c *Client) Batch(ctx context.Context, q outbox.Querier, callback outbox.Task, children []outbox.Task) (BatchResult, error) {
	r, err := c.batch(ctx, q, callback, children)
	return r, notmigrated.Classify(err)
}

func (c *Client) batch(ctx context.Context, q outbox.Querier, callback outbox.Task, children []outbox.Task) (BatchResult, error) {
	if err := c.ob.Validate(callback); err != nil {
		return BatchResult{}, fmt.Errorf("workflow: batch: callback: %w", err)
	}
	if len(children) > MaxBatch {
		return BatchResult{}, fmt.Errorf("workflow: batch %s/%s: %w: %d children, at most %d", callback.Queue, callback.ID, ErrTooManyDependencies, len(children), MaxBatch)
	}
	order := make([]int, len(children))
	for i, t := range children {
		if err := c.ob.Validate(t); err != nil {
			return BatchResult{}, fmt.Errorf("workflow: batch %s/%s: child %d: %w", callback.Queue, callback.ID, i, err)
		}
		if t.Queue == callback.Queue && t.ID == callback.ID {
			return BatchResult{}, fmt.Errorf("workflow: batch %s/%s: %w: the callback is among its children", callback.Queue, callback.ID, ErrCycle)
		}
		order[i] = i
	}
	// Sent in key order, as EnqueueMany's rows: two batches with common
	// children wait for each other instead of deadlocking.
	key := func(i int) string { return children[i].Queue + "\x00" + children[i].ID }
	slices.SortFunc(order, func(i, j int) int {
		return cmp.Or(strings.Compare(children[i].Queue, children[j].Queue), strings.Compare(children[i].ID, children[j].ID))
	})
	n := len(children)
	var (
		queues   = make([]string, n)
		ids      = make([]string, n)
		runAts   = make([]*time.Time, n)
		delays   = make([]time.Duration, n)
		payloads = make([][]byte, n)
		attempts = make([]int32, n)
		traces   []*string
		startBys = make([]*time.Time, n)
		prios    []int16
		ckeys    []*string
	)
	for k, i := range order {
		if k > 0 && key(order[k-1]) == key(i) {
			return BatchResult{}, fmt.Errorf("workflow: batch %s/%s: %w: child %s/%s comes twice", callback.Queue, callback.ID, ErrCycle, children[i].Queue, children[i].ID)
		}
		a := c.args(ctx, children[i])
		queues[k], ids[k], runAts[k] = a[0].(string), a[1].(string), a[2].(*time.Time)
		delays[k] = time.Duration(a[3].(int64)) * time.Microsecond
		payloads[k], attempts[k], startBys[k] = a[4].([]byte), a[5].(int32), a[7].(*time.Time)
		if tr := a[6].(*string); tr != nil && traces == nil {
			traces = make([]*string, n)
		}
		if traces != nil {
			traces[k] = a[6].(*string)
		}
		if p := a[8].(int16); p != 0 && prios == nil {
			prios = make([]int16, n)
		}
		if prios != nil {
			prios[k] = a[8].(int16)
		}
		if ck := children[i].ConcurrencyKey; ck != "" && ckeys == nil {
			ckeys = make([]*string, n)
		}
		if ckeys != nil && children[i].ConcurrencyKey != "" {
			ck := children[i].ConcurrencyKey
			ckeys[k] = &ck
		}
	}
	var cbKey *string
	if callback.ConcurrencyKey != "" {
		cbKey = &callback.ConcurrencyKey
	}
	var (
		batchID *int64
		runAt   *time.Time
		added   int
		notes   int64
	)
	args := append(c.args(ctx, callback), queues, ids, runAts, delays, payloads, attempts, traces, startBys, prios, cbKey, ckeys)
	if err := q.QueryRow(ctx, c.sql.EnqueueBatch, args...).Scan(&batchID, &runAt, &added, &notes); err != nil {
		return BatchResult{}, fmt.Errorf("workflow: batch %s/%s: %w", callback.Queue, callback.ID, err)
	}
	if batchID == nil {
		return BatchResult{Duplicate: true}, nil
	}
	if added == 0 {
		if _, err := q.Exec(ctx, c.sql.ReleaseBatch, callback.Queue, callback.ID); err != nil {
			return BatchResult{}, fmt.Errorf("workflow: batch %s/%s: release the callback of an empty batch: %w", callback.Queue, callback.ID, err)
		}
	}
	return BatchResult{Children: added, Duplicates: n - added, RunAt: *runAt}, nil
}

// BatchCounts reads the progress of the batch whose callback is queue/id, in
// q (a pool, or a transaction: the callback's handler reads it in its own).
// Once the callback runs, Remaining is 0 and the counts are final.
// outbox.ErrNotFound when queue/id is not a batch's callback (or its row was
// deleted: the counter goes with it).
func (c *Client) BatchCounts(ctx context.Context, q outbox.Querier, queue, id string) (BatchCounts, error) {
	b, ok, err := c.deps.Batch(ctx, q, queue, id)
	switch {
	case err != nil:
		return BatchCounts{}, notmigrated.Classify(fmt.Errorf("workflow: %w", err))
	case !ok:
		return BatchCounts{}, fmt.Errorf("workflow: batch of %s/%s: %w", queue, id, outbox.ErrNotFound)
	}
	return BatchCounts{Total: b.Total, Remaining: b.Remaining, Done: b.Done, Dead: b.Dead, Cancelled: b.Cancelled,
		CreatedAt: b.CreatedAt, FinishedAt: b.FinishedAt}, nil
}

// Cancel cancels, in q (the caller's transaction), what has not run of the
// workflow queue/id belongs to, and returns how many tasks it cancelled:
//
//   - queue/id is a batch's callback, or a child not finished yet: the
//     children not finished (counted cancelled, in one update of the batch's
//     counter) and then the callback, unless it finished;
//   - otherwise the tasks connected to queue/id by dependencies still waiting
//     (a chain, from any of its tasks not finished: its last one is waiting
//     until the end), those pending, queued or waiting, in one statement.
//
// As with outbox.Client.Cancel, a cancelled task that is in Redis is refused
// at its completion (its transactional effect rolled back) and removed from
// Redis by the worker or reconcile; a run that committed first stays done. The
// dependents of a cancelled task outside the set settle as their policies say.
//
// Errors: outbox.ErrNotFound when queue/id has no row;
// ErrTooManyDependencies when the dependencies connect more than 10,000 tasks
// (nothing written).
func (c *Client) Cancel(ctx context.Context, q outbox.Querier, queue, id string) (int, error) {
	n, err := c.cancel(ctx, q, queue, id)
	return n, notmigrated.Classify(err)
}

func (c *Client) cancel(ctx context.Context, q outbox.Querier, queue, id string) (int, error) {
	var (
		batchID *int64
		cq, cid *string
	)
	err := q.QueryRow(ctx, c.sql.BatchOf, queue, id).Scan(&batchID, &cq, &cid)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, fmt.Errorf("workflow: cancel %s/%s: %w", queue, id, outbox.ErrNotFound)
	case err != nil:
		return 0, fmt.Errorf("workflow: cancel %s/%s: %w", queue, id, err)
	}
	if batchID != nil {
		var n int
		if err := q.QueryRow(ctx, c.sql.CancelBatch, *batchID, *cq, *cid).Scan(&n); err != nil {
			return 0, fmt.Errorf("workflow: cancel the batch of %s/%s: %w", *cq, *cid, err)
		}
		switch err := c.ob.Cancel(ctx, q, *cq, *cid); {
		case err == nil:
			n++
		case !errors.Is(err, outbox.ErrFinished):
			return 0, fmt.Errorf("workflow: cancel the batch of %s/%s: %w", *cq, *cid, err)
		}
		return n, nil
	}
	qs, ids, truncated, err := c.deps.Walk(ctx, q, queue, id, cancelBound)
	if err != nil {
		return 0, fmt.Errorf("workflow: cancel %s/%s: %w", queue, id, err)
	}
	if truncated {
		return 0, fmt.Errorf("workflow: cancel %s/%s: %w: the workflow has more than %d tasks; nothing cancelled", queue, id, ErrTooManyDependencies, cancelBound)
	}
	rows, err := q.Query(ctx, c.sql.CancelTasks, qs, ids)
	if err != nil {
		return 0, fmt.Errorf("workflow: cancel %s/%s: %w", queue, id, err)
	}
	var kq, kid string
	n, err := pgx.ForEachRow(rows, []any{&kq, &kid}, func() error { return nil })
	if err != nil {
		return 0, fmt.Errorf("workflow: cancel %s/%s: %w", queue, id, err)
	}
	return int(n.RowsAffected()), nil
}
