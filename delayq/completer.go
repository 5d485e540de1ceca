package delayq

import (
	"context"
	"fmt"
	"slices"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/transition"
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

// recordBatch marks a batch of plain runs done, atomically, and hands the applied
// ones to the acknowledger, which ends them. A run refused (or a batch that
// failed) is settled on a goroutine of its own, as the run itself would have: a
// rare path, with round trips of its own.
func (w *worker) recordBatch(batch []*run) {
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.OpTimeout)
	defer cancel()
	cs := make([]transition.Completion, len(batch))
	for i, r := range batch {
		cs[i] = transition.Completion{Claim: r.lease(), ClearPayload: r.q.cfg.ClearPayload}
	}
	// One statement is its own transaction: one round trip.
	done, err := w.ops.MarkDoneMany(ctx, w.pool, cs)
	if err == nil {
		w.pg.OK()
	} else {
		w.pg.Report("record completions", err) // the runs fail and say why
	}
	acks := make([]ackItem, 0, len(batch))
	for i, r := range batch {
		switch {
		case err != nil:
			w.settleAside(r, func(ctx context.Context) outcome {
				return r.fail(ctx, fmt.Errorf("record completion: %w", err))
			})
		case !done[i].OK():
			w.settleAside(r, func(ctx context.Context) outcome {
				o, err := r.refusedByState(ctx)
				if err != nil {
					return r.fail(ctx, err)
				}
				return o
			})
		default:
			w.stats.succeeded.Add(1)
			acks = append(acks, ackItem{r: r, d: done[i]})
		}
	}
	if len(acks) > 0 {
		w.acks <- acks // the whole batch in one hand-off: acked together
	}
}

// settleAside settles a handed-off run with settle on a goroutine of its own,
// within OpTimeout, and ends it. The stages wait for these before they stop.
func (w *worker) settleAside(r *run, settle func(ctx context.Context) outcome) {
	w.aside.Go(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.octx), w.cfg.OpTimeout)
		defer cancel()
		r.finish(settle(ctx))
	})
}

// handOffPlain hands a successful plain run to the batch recorder: its goroutine
// returns to the pool at once, and the stages end the run (outPending).
func (r *run) handOffPlain() outcome {
	r.w.completions <- r // the recorder takes it within OpTimeout
	return outPending
}

// handOff hands a run whose completion committed to the acknowledger, which acks
// Redis and ends the run (outPending).
func (r *run) handOff(d transition.Done) outcome {
	r.w.stats.succeeded.Add(1)
	r.w.acks <- []ackItem{{r: r, d: d}}
	return outPending
}

// ackItem is one successful run waiting for its Redis acknowledgement, d its
// committed completion. With done nil the run was handed off: the acknowledger
// ends it; else the run waits for the ack's result on done.
type ackItem struct {
	r    *run
	d    transition.Done
	done chan error
}

// ackBatch completes the runs of batches (each a recorded batch, or one run) in
// Redis, one call per queue, and ends the runs
// handed off or answers those waiting: nil, an ErrLeaseLost error, or the call's
// error.
func (w *worker) ackBatch(batches [][]ackItem) {
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.OpTimeout)
	defer cancel()
	batch := slices.Concat(batches...)
	byQueue := make(map[string][]ackItem, 1)
	for _, a := range batch {
		a.r.hbOff() // a renewal from now on is refused anyway: the ack revokes the token
		if f := w.hooks.beforeAck; f != nil {
			if err := f(a.r.t); err != nil {
				w.acked(a, err)
				continue
			}
		}
		byQueue[a.r.t.Queue] = append(byQueue[a.r.t.Queue], a)
	}
	ds := make([]transition.Done, 0, len(batch))
	for _, items := range byQueue {
		ds = ds[:0]
		for _, a := range items {
			ds = append(ds, a.d)
		}
		done, err := w.ops.AckDone(ctx, ds)
		if err == nil {
			w.rd.OK()
		}
		for i, a := range items {
			switch {
			case err != nil:
				w.acked(a, err)
			case !done[i]:
				w.acked(a, leaseLost(a.r.t))
			default:
				w.acked(a, nil)
			}
		}
	}
}

// acked answers a run waiting for its ack, or ends a run handed off.
func (w *worker) acked(a ackItem, err error) {
	if a.done != nil {
		a.done <- err
		return
	}
	a.r.ackFailed(err)
	a.r.finish(outSucceeded)
}

func leaseLost(t *Task) error {
	return fmt.Errorf("delayq: complete %s/%s: %w", t.Queue, t.ID, dispatch.ErrLeaseLost)
}

// acknowledge completes the run's task in Redis through the batch and waits for
// the result.
func (r *run) acknowledge(d transition.Done) error {
	a := ackItem{r: r, d: d, done: make(chan error, 1)}
	r.w.acks <- []ackItem{a} // the acknowledger takes it within OpTimeout
	return <-a.done          // answered within OpTimeout
}
