package outbox

import (
	"context"
	"fmt"
	"time"
)

// Result reports what one enqueue did.
type Result struct {
	// Duplicate is true when a task with this queue and id exists already (in any state,
	// for as long as its row is kept) or came earlier in the same batch. Nothing was
	// written for it, and the caller's transaction is unharmed.
	Duplicate bool
	// RunAt is when the new task is due, on the database clock when a Delay was given.
	// Zero for a duplicate.
	RunAt time.Time
}

// ManyResult reports what EnqueueMany did.
type ManyResult struct {
	// Inserted counts the new tasks, Duplicates the others; they add up to the number of
	// tasks given.
	Inserted, Duplicates int
	// Results holds one Result per task given, in the same order.
	Results []Result
}

// Enqueue inserts t into the outbox through q, normally the caller's transaction, so the
// task exists if and only if that transaction commits. The relay is notified at commit.
// A task whose queue and id exist already is reported as Result.Duplicate, without an
// error: the caller's transaction stays usable.
//
// Invalid input is reported before anything is sent, with an error wrapping one of the
// sentinels listed at Validate.
func (c *Client) Enqueue(ctx context.Context, q Querier, t Task) (Result, error) {
	return c.enqueue(ctx, pgxRunner{q}, t)
}

// EnqueueSQL is Enqueue on a database/sql transaction (or sqlx, or GORM's ConnPool).
func (c *Client) EnqueueSQL(ctx context.Context, tx SQLQuerier, t Task) (Result, error) {
	return c.enqueue(ctx, sqlRunner{tx}, t)
}

// EnqueueMany inserts tasks in one statement, one round trip however many they are.
// Every task is validated first: if one is invalid, the error names its index and
// nothing is sent. Duplicates (of existing rows, or of an earlier task in the same
// slice) are counted and marked in Results. The relay is notified once per queue at
// commit.
//
// All payloads travel in one message, which Postgres limits to 1 GB: split batches of
// large payloads accordingly.
func (c *Client) EnqueueMany(ctx context.Context, q Querier, tasks []Task) (ManyResult, error) {
	return c.enqueueMany(ctx, pgxRunner{q}, tasks)
}

// EnqueueManySQL is EnqueueMany on a database/sql transaction. The driver must be pgx's
// (github.com/jackc/pgx/v5/stdlib), which can send arrays.
func (c *Client) EnqueueManySQL(ctx context.Context, tx SQLQuerier, tasks []Task) (ManyResult, error) {
	return c.enqueueMany(ctx, sqlRunner{tx}, tasks)
}

func (c *Client) enqueue(ctx context.Context, r runner, t Task) (Result, error) {
	if err := c.Validate(t); err != nil {
		return Result{}, fmt.Errorf("outbox: enqueue: %w", err)
	}
	w := c.row(t)
	res := Result{Duplicate: true}
	err := r.query(ctx, c.sql.enqueue, []any{w.queue, w.id, w.runAt, w.delayUS, w.payload, w.maxAttempts},
		func(scan func(...any) error) error {
			var notified int64
			res.Duplicate = false
			return scan(&res.RunAt, &notified)
		})
	if err != nil {
		return Result{}, fmt.Errorf("outbox: enqueue %s/%s: %w", t.Queue, t.ID, err)
	}
	return res, nil
}

type key struct{ queue, id string }

func (c *Client) enqueueMany(ctx context.Context, r runner, tasks []Task) (ManyResult, error) {
	for i, t := range tasks {
		if err := c.Validate(t); err != nil {
			return ManyResult{}, fmt.Errorf("outbox: enqueue many: task %d of %d: %w", i, len(tasks), err)
		}
	}
	out := ManyResult{Results: make([]Result, len(tasks))}
	if len(tasks) == 0 {
		return out, nil
	}
	// The first of several tasks with one key is sent; the others are duplicates.
	first := make(map[key]int, len(tasks))
	var (
		queues, ids []string
		runAts      []*time.Time
		delays      []int64
		payloads    [][]byte
		attempts    []int32
	)
	for i, t := range tasks {
		k := key{t.Queue, t.ID}
		if _, dup := first[k]; dup {
			continue
		}
		first[k] = i
		w := c.row(t)
		queues = append(queues, w.queue)
		ids = append(ids, w.id)
		runAts = append(runAts, w.runAt)
		delays = append(delays, w.delayUS)
		payloads = append(payloads, w.payload)
		attempts = append(attempts, w.maxAttempts)
	}
	inserted := make(map[key]time.Time, len(queues))
	err := r.query(ctx, c.sql.enqueueMany, []any{queues, ids, runAts, delays, payloads, attempts},
		func(scan func(...any) error) error {
			var (
				k        key
				at       time.Time
				notified int64
			)
			if err := scan(&k.queue, &k.id, &at, &notified); err != nil {
				return err
			}
			inserted[k] = at
			return nil
		})
	if err != nil {
		return ManyResult{}, fmt.Errorf("outbox: enqueue many (%d tasks): %w", len(tasks), err)
	}
	for i, t := range tasks {
		k := key{t.Queue, t.ID}
		at, ok := inserted[k]
		if ok && first[k] == i {
			out.Results[i] = Result{RunAt: at}
			out.Inserted++
			continue
		}
		out.Results[i] = Result{Duplicate: true}
		out.Duplicates++
	}
	return out, nil
}
