package delayq

import (
	"context"
	"fmt"
)

// WorkResult is the run Work made.
type WorkResult struct {
	// Task is the task that ran; nil when none of the queue was due.
	Task *Task
	// Outcome is how the run ended.
	Outcome Outcome
	// Err is the run's failure (the handler's error or panic, or the
	// completion's); nil unless it failed.
	Err error
}

// Work claims one due task of queue and runs it to its end, synchronously, as Run
// would: middleware, handler, completion guard and commit, hooks, the Redis ack or
// retry. It is for tests (package delayqtest) and tools; it cannot be called while
// Run runs (ErrRunning). A queue without a registered handler is ErrInvalidQueue.
func (w *worker) Work(ctx context.Context, queue string) (WorkResult, error) {
	w.mu.Lock()
	q, ok := w.queues[queue]
	switch {
	case w.running:
		w.mu.Unlock()
		return WorkResult{}, ErrRunning
	case !ok:
		w.mu.Unlock()
		return WorkResult{}, fmt.Errorf("%w: no handler registered for queue %q", ErrInvalidQueue, queue)
	}
	w.running = true
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.running = false
		w.mu.Unlock()
	}()

	cl, err := w.dq.Claim(ctx, queue, 1, w.cfg.Lease)
	if err != nil {
		return WorkResult{}, fmt.Errorf("worker: claim: %w", err)
	}
	if len(cl.Tasks) == 0 {
		return WorkResult{}, nil
	}
	stop := w.startStages()
	t, o, failure := w.run(ctx, q, cl.Tasks[0], cl.Now, func() {})
	stop()
	return WorkResult{Task: t, Outcome: Outcome(o), Err: failure}, nil
}
