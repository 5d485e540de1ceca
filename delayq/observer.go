package delayq

import (
	"context"
	"time"
)

// Observer receives the events of a Client's claims and runs, in the manner of
// pgx's tracers: the Prometheus metrics (Config.Registerer) are one Observer, an
// OpenTelemetry tracer (package delayqotel) is another, and Observers combines
// several. An Observer is called from the worker's goroutines, concurrently: it must
// be safe for concurrent use and return quickly (it runs in the claim loop and
// around every handler).
type Observer interface {
	// Claim is called after each claim of a queue, with the number of tasks it
	// leased (0 when none was due) or its error.
	Claim(ctx context.Context, e ClaimEvent)
	// RunStart is called when a claimed task starts to run, before its handler.
	// The context it returns is the one the handler runs with and RunEnd gets: a
	// tracer starts a span here. Return ctx when there is nothing to add.
	RunStart(ctx context.Context, t *Task) context.Context
	// RunEnd is called once per RunStart, after the run's bookkeeping (commit, ack,
	// retry, dead, release) is over, with how the run ended.
	RunEnd(ctx context.Context, t *Task, e RunEndEvent)
}

// ClaimEvent is one claim of up to Asked tasks of Queue.
type ClaimEvent struct {
	Queue string
	// Asked is how many tasks the claim asked for (the free slots), Claimed how
	// many it leased.
	Asked, Claimed int
	// Err is the claim's error (Redis unreachable, say); nil when it answered.
	Err error
}

// Outcome is how a run ended, as RunEndEvent reports it.
type Outcome string

// The outcomes of a run.
const (
	// OutcomeSucceeded: the handler returned nil and the task is done.
	OutcomeSucceeded Outcome = "succeeded"
	// OutcomeRetried: the run failed and the task runs again after a backoff.
	OutcomeRetried Outcome = "retried"
	// OutcomeDead: the run failed with no attempt left (or NoRetry): the task is
	// dead in both stores.
	OutcomeDead Outcome = "dead"
	// OutcomeSuppressed: the outbox guard refused the completion (the task had
	// finished elsewhere, was cancelled or rescheduled): a duplicate delivery whose
	// effect was rolled back.
	OutcomeSuppressed Outcome = "suppressed"
	// OutcomeLeaseLost: the worker lost the task's lease during the run; whoever
	// holds it now decides.
	OutcomeLeaseLost Outcome = "lease_lost"
	// OutcomeReleased: interrupted by a shutdown, the lease given back; the run is
	// not counted as an attempt.
	OutcomeReleased Outcome = "released"
	// OutcomeStale: the outbox row changed under the completion; the task was given
	// back to run later.
	OutcomeStale Outcome = "stale"
	// OutcomeSnoozed: the handler returned Snooze (or the queue's OnDead hook
	// failed): the task runs again later, the run not counted.
	OutcomeSnoozed Outcome = "snoozed"
	// OutcomeCancelled: the handler returned Cancel: the task is cancelled.
	OutcomeCancelled Outcome = "cancelled"
	// OutcomeMissedDeadline: the task was claimed after its start deadline; its
	// handler did not run, and it is dead in both stores with the reason
	// (ErrMissedDeadline), its OnMissedDeadline hook run with the death.
	OutcomeMissedDeadline Outcome = "missed_deadline"
	// OutcomeError: the bookkeeping failed (a server down); the lease will expire
	// and the reaper takes the task back.
	OutcomeError Outcome = "error"
)

// RunEndEvent is how one run ended.
type RunEndEvent struct {
	Outcome Outcome
	// Err is the failure of a failed run (the handler's error or panic, or the
	// completion's); nil when the run did not fail.
	Err error
	// LeaseLost: the worker found during the run that it no longer held the lease
	// (also true with other outcomes: a lease lost after the commit, say).
	LeaseLost bool
	// Duration runs from the start of the handler to the end of the bookkeeping.
	Duration time.Duration
}

// observers returns an Observer that calls each non-nil one of obs in turn (the
// contexts RunStart returns are chained in that order), or nil when there is none.
func observers(obs ...Observer) Observer {
	var all multiObserver
	for _, o := range obs {
		switch o := o.(type) {
		case nil:
		case multiObserver:
			all = append(all, o...)
		default:
			all = append(all, o)
		}
	}
	switch len(all) {
	case 0:
		return nil
	case 1:
		return all[0]
	}
	return all
}

type multiObserver []Observer

func (m multiObserver) Claim(ctx context.Context, e ClaimEvent) {
	for _, o := range m {
		o.Claim(ctx, e)
	}
}

func (m multiObserver) RunStart(ctx context.Context, t *Task) context.Context {
	for _, o := range m {
		ctx = o.RunStart(ctx, t)
	}
	return ctx
}

func (m multiObserver) RunEnd(ctx context.Context, t *Task, e RunEndEvent) {
	for _, o := range m {
		o.RunEnd(ctx, t, e)
	}
}

// nopObserver observes nothing: the worker's observer when none is configured.
type nopObserver struct{}

func (nopObserver) Claim(context.Context, ClaimEvent)                     {}
func (nopObserver) RunStart(ctx context.Context, _ *Task) context.Context { return ctx }
func (nopObserver) RunEnd(context.Context, *Task, RunEndEvent)            {}
