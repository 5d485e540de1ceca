package worker

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/outbox"
)

// The completions of plain handlers are recorded in batches: one guarded UPDATE
// for every run that finished while the previous batch was being written, so one
// commit (one disk flush) serves many tasks. No timer: a batch is whatever queued
// up meanwhile, a single task when the worker is quiet.

// maxCompletionBatch bounds one batch.
const maxCompletionBatch = 1000

// completion is one plain run waiting for its completion to be recorded.
type completion struct {
	key   outbox.TaskKey
	clear bool // clear the payload too (QueueConfig.ClearPayload)
	done  chan completionResult
}

type completionResult struct {
	applied bool
	err     error
}

// completeLoop records the completions sent on in until in is closed.
func (w *Worker) completeLoop(in <-chan *completion) {
	batch := make([]*completion, 0, maxCompletionBatch)
	for c := range in {
		batch = append(batch[:0], c)
	more:
		for len(batch) < maxCompletionBatch {
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
		w.recordBatch(batch)
	}
}

// recordBatch marks a batch done in one transaction and answers every run.
func (w *Worker) recordBatch(batch []*completion) {
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.OpTimeout)
	defer cancel()
	keys := make([]outbox.TaskKey, len(batch))
	var clear []string // queue, id pairs of the runs that clear their payload
	for i, c := range batch {
		keys[i] = c.key
		if c.clear {
			clear = append(clear, c.key.Queue, c.key.ID)
		}
	}
	var applied []bool
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		var err error
		if applied, err = w.ob.MarkDoneMany(ctx, tx, keys); err != nil {
			return err
		}
		for i := 0; i < len(clear); i += 2 {
			if _, err := tx.Exec(ctx, w.sqlClearPayload, clear[i], clear[i+1]); err != nil {
				return fmt.Errorf("clear payload: %w", err)
			}
		}
		return nil
	})
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
		key:   outbox.TaskKey{Queue: t.Queue, ID: t.ID, Version: t.Version},
		clear: r.q.cfg.ClearPayload,
		done:  make(chan completionResult, 1),
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
		st, err := w.rowState(ctx, w.pool, t)
		if err != nil {
			return "", fmt.Errorf("record completion: %w", err)
		}
		return r.refused(ctx, st), nil
	}
	return r.succeeded(ctx), nil
}
