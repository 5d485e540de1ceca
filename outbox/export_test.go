package outbox

import (
	"context"

	"github.com/delayq/delayq/internal/taskstate"
)

// EnqueueManyStatement is the SQL of EnqueueMany, for tests of its plan.
func (c *Client) EnqueueManyStatement() string { return c.sql.EnqueueMany }

// MarkDone runs the completion guard with c's statements (the worker's, in
// taskstate), for tests of how it meets the producer's calls.
func (c *Client) MarkDone(ctx context.Context, q Querier, queue, id string, version int) (bool, error) {
	return c.store.MarkDone(ctx, q, taskstate.Key{Queue: queue, ID: id, Version: version}, false)
}

// RecordFailure records a failed run with c's statements (the worker's, in taskstate).
func (c *Client) RecordFailure(ctx context.Context, q Querier, queue, id string, version, attempt int,
	lastErr string, dead bool,
) (bool, error) {
	return c.store.RecordFailure(ctx, q, taskstate.Failure{
		Key: taskstate.Key{Queue: queue, ID: id, Version: version}, Attempt: attempt, Err: lastErr, Dead: dead,
	})
}

// MarkDoneMany runs the guard for many tasks with c's statements.
func (c *Client) MarkDoneMany(ctx context.Context, q Querier, keys []taskstate.Key) ([]bool, error) {
	done := make([]taskstate.Completion, len(keys))
	for i, k := range keys {
		done[i] = taskstate.Completion{Key: k}
	}
	return c.store.MarkDoneMany(ctx, q, done)
}

// Table is the quoted, schema-qualified outbox table of c.
func (c *Client) Table() string { return c.table() }
