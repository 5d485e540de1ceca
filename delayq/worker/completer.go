package worker

import (
	"context"
	"fmt"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/taskstate"
)

// Finished runs are settled in batches, in two stages that overlap:
//
//   - the completions of plain handlers are recorded in Postgres with one guarded
//     UPDATE for every run that finished while the previous batch was being
//     written, so one commit (one disk flush) serves many tasks;
//   - the Redis acknowledgements of every successful run, plain or transactional,
//     go out with one complete script call per queue for every run that committed
//     meanwhile.
//
// No timer: a batch is whatever queued up meanwhile, a single task when the worker
// is quiet, so batching never delays a lone task.

// maxBatch bounds one batch of either stage (delayq's limit for one complete call).
const maxBatch = 1000

// batches calls settle with each batch sent on in: the first item it waits for and
// those already queued behind it, up to maxBatch. It returns when in is closed.
func batches[T any](in <-chan T, settle func([]T)) {
	batch := make([]T, 0, maxBatch)
	for c := range in {
		batch = append(batch[:0], c)
	more:
		for len(batch) < maxBatch {
			select {
			case c, ok := <-in:
				if !ok {
					break more
				}
				batch = append(batch, c)
			default:
				break more
			}
		}
		settle(batch)
	}
}

// completion is one plain run waiting for its completion to be recorded.
type completion struct {
	completion taskstate.Completion
	done       chan completionResult
}

type completionResult struct {
	applied bool
	err     error
}

// recordBatch marks a batch done, atomically, and answers every run.
func (w *Worker) recordBatch(batch []*completion) {
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.OpTimeout)
	defer cancel()
	done := make([]taskstate.Completion, len(batch))
	for i, c := range batch {
		done[i] = c.completion
	}
	// One statement is its own transaction: one round trip.
	applied, err := w.store.MarkDoneMany(ctx, w.pool, done)
	for i, c := range batch {
		if err != nil {
			c.done <- completionResult{err: fmt.Errorf("record completion: %w", err)}
			continue
		}
		c.done <- completionResult{applied: applied[i]}
	}
}

// completePlain records a plain run's completion through the batch, then acks
// Redis as complete does for a transactional run.
func (r *run) completePlain(ctx context.Context) (outcome, error) {
	w, t := r.w, r.t
	c := &completion{
		completion: taskstate.Completion{
			Key:          taskstate.Key{Queue: t.Queue, ID: t.ID, Version: t.Version},
			ClearPayload: r.q.cfg.ClearPayload,
		},
		done: make(chan completionResult, 1),
	}
	select {
	case w.completions <- c:
	case <-ctx.Done():
		return "", fmt.Errorf("record completion: %w", ctx.Err())
	}
	res := <-c.done // answered within OpTimeout
	if res.err != nil {
		return "", res.err
	}
	if !res.applied {
		return r.refusedByState(ctx)
	}
	return r.succeeded(ctx), nil
}

// ackRequest is one successful run waiting for its Redis acknowledgement.
type ackRequest struct {
	queue string
	lease delayq.Lease
	done  chan error
}

// ackBatch completes a batch in Redis, one call per queue, and answers every run:
// nil, an ErrLeaseLost error, or the call's error.
func (w *Worker) ackBatch(batch []*ackRequest) {
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.OpTimeout)
	defer cancel()
	byQueue := make(map[string][]*ackRequest, 1)
	for _, a := range batch {
		byQueue[a.queue] = append(byQueue[a.queue], a)
	}
	leases := make([]delayq.Lease, 0, len(batch))
	for q, reqs := range byQueue {
		leases = leases[:0]
		for _, a := range reqs {
			leases = append(leases, a.lease)
		}
		done, err := w.dq.CompleteMany(ctx, q, leases)
		for i, a := range reqs {
			switch {
			case err != nil:
				a.done <- err
			case !done[i]:
				a.done <- fmt.Errorf("delayq: complete %s/%s: %w", q, a.lease.ID, delayq.ErrLeaseLost)
			default:
				a.done <- nil
			}
		}
	}
}

// acknowledge completes the run's task in Redis through the batch.
func (r *run) acknowledge(ctx context.Context) error {
	a := &ackRequest{
		queue: r.t.Queue,
		lease: delayq.Lease{ID: r.t.ID, Token: r.ct.Token},
		done:  make(chan error, 1),
	}
	select {
	case r.w.acks <- a:
	case <-ctx.Done():
		return fmt.Errorf("complete: %w", ctx.Err())
	}
	return <-a.done // answered within OpTimeout
}
