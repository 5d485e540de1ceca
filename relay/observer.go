package relay

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/reconcile"
)

// Observer receives a Relay's events, in the manner of pgx's tracers: the
// Prometheus metrics (Config.Registerer) are one Observer, Stats another, an
// OpenTelemetry tracer (package delayqotel) a third; Observers combines several.
// Observe is called from the relay's loops, concurrently: it must be safe for
// concurrent use and return quickly. e is one of the *Event types of this package;
// an Observer ignores those it does not know (more may come).
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// Event is one of MoveEvent, ReapEvent, ErrorEvent, RetentionEvent,
// DivergenceEvent, RedisLossEvent, LeaderEvent, PassEvent, LagEvent, DepthEvent and
// OverdueEvent.
type Event interface{ relayEvent() }

// MoveEvent: a round moved rows to Redis and committed.
type MoveEvent struct {
	// Added, Duplicate (already in Redis: a repeated round), Replaced (a
	// rescheduled task) and Invalid (refused by Redis, set dead) count the rows.
	Added, Duplicate, Replaced, Invalid int
	// Tasks are the tasks written to Redis, by queue (Invalid rows are not among
	// them). The Observer must not change or keep them.
	Tasks []dispatch.QueueTasks
	// Start is when the round began; Duration covers select, Redis write, update
	// and commit.
	Start    time.Time
	Duration time.Duration
}

// ReapEvent: the reaper took expired leases of Queue back.
type ReapEvent struct {
	Queue string
	// Requeued to run again, Dead (out of attempts: dead in both stores), Finished
	// (the outbox row had finished: removed from Redis), Orphans (an active entry
	// without its task hash, dropped).
	Requeued, Dead, Finished, Orphans int
}

// ErrorEvent: an operation of the relay failed; it backs off and retries.
type ErrorEvent struct {
	// Kind is the label of delayq_relay_errors_total: postgres, redis, listen,
	// reap, retention, stats, heal.
	Kind string
	Op   string
	Err  error
}

// RetentionEvent: the retention deleted finished rows.
type RetentionEvent struct{ Deleted int64 }

// DivergenceEvent: a step of the anti-entropy pass found (and repaired)
// disagreements of Postgres and Redis of one kind in Queue.
type DivergenceEvent struct {
	Queue           string
	Kind            reconcile.Kind
	Found, Repaired int
	// Sample holds some of the task ids found.
	Sample []string
}

// RedisLossEvent: a Redis master lost its epoch mark (restarted without
// persistence, flushed, failed over): a full repair starts.
type RedisLossEvent struct {
	Reason string
	Shards []string
}

// LeaderEvent: this relay took or lost the lead of the self-healing.
type LeaderEvent struct{ Leading bool }

// PassEvent: the leader completed an anti-entropy pass.
type PassEvent struct {
	Rows, Found, Repaired int
	Duration              time.Duration
}

// LagEvent: the age of the oldest pending row that is due (0 when none is).
type LagEvent struct{ Lag time.Duration }

// DepthEvent: the outbox rows by state, every StatsInterval. Pending, Queued and
// Dead are exact up to 100,000; Done and Cancelled are the planner's estimates.
type DepthEvent struct{ Pending, Queued, Dead, Done, Cancelled int64 }

// OverdueEvent: the tasks of Queue in Redis due more than OverdueAfter ago and
// not claimed, every StatsInterval.
type OverdueEvent struct {
	Queue string
	Tasks int64
}

func (MoveEvent) relayEvent()       {}
func (ReapEvent) relayEvent()       {}
func (ErrorEvent) relayEvent()      {}
func (RetentionEvent) relayEvent()  {}
func (DivergenceEvent) relayEvent() {}
func (RedisLossEvent) relayEvent()  {}
func (LeaderEvent) relayEvent()     {}
func (PassEvent) relayEvent()       {}
func (LagEvent) relayEvent()        {}
func (DepthEvent) relayEvent()      {}
func (OverdueEvent) relayEvent()    {}

// Observers returns an Observer that calls each non-nil one of obs in turn, or
// nil when there is none.
func Observers(obs ...Observer) Observer {
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

func (m multiObserver) Observe(ctx context.Context, e Event) {
	for _, o := range m {
		o.Observe(ctx, e)
	}
}

// Stats are the counts of one Relay since New.
type Stats struct {
	// Rounds that moved rows, and the rows they moved: Added, Duplicate (already
	// in Redis), Replaced (rescheduled), Invalid (refused by Redis, set dead).
	Rounds                              int64
	Added, Duplicate, Replaced, Invalid int64
	// Expired leases the reaper took back: requeued, dead, finished, orphans.
	Requeued, ReapedDead, ReapedFinished, Orphans int64
	// Errors of every kind (the relay backed off and retried).
	Errors int64
	// RetentionDeleted counts finished rows pruned.
	RetentionDeleted int64
	// Divergences of Postgres and Redis the anti-entropy found and repaired, Passes
	// it completed, RedisLosses it detected.
	DivergencesFound, DivergencesRepaired, Passes, RedisLosses int64
	// Leader: this relay leads the self-healing now.
	Leader bool
	// Lag is the age of the oldest due pending row, as last measured.
	Lag time.Duration
}

// statsObserver keeps the counts of Stats.
type statsObserver struct {
	rounds, added, dup, repl, invalid                atomic.Int64
	requeued, reapedDead, reapedFinished, orphans    atomic.Int64
	errs, retention, found, repaired, passes, losses atomic.Int64
	leader                                           atomic.Bool
	lag                                              atomic.Int64
}

func (s *statsObserver) Observe(_ context.Context, e Event) {
	switch e := e.(type) {
	case MoveEvent:
		s.rounds.Add(1)
		s.added.Add(int64(e.Added))
		s.dup.Add(int64(e.Duplicate))
		s.repl.Add(int64(e.Replaced))
		s.invalid.Add(int64(e.Invalid))
	case ReapEvent:
		s.requeued.Add(int64(e.Requeued))
		s.reapedDead.Add(int64(e.Dead))
		s.reapedFinished.Add(int64(e.Finished))
		s.orphans.Add(int64(e.Orphans))
	case ErrorEvent:
		s.errs.Add(1)
	case RetentionEvent:
		s.retention.Add(e.Deleted)
	case DivergenceEvent:
		s.found.Add(int64(e.Found))
		s.repaired.Add(int64(e.Repaired))
	case RedisLossEvent:
		s.losses.Add(1)
	case LeaderEvent:
		s.leader.Store(e.Leading)
	case PassEvent:
		s.passes.Add(1)
	case LagEvent:
		s.lag.Store(int64(e.Lag))
	}
}

func (s *statsObserver) snapshot() Stats {
	return Stats{
		Rounds: s.rounds.Load(), Added: s.added.Load(), Duplicate: s.dup.Load(),
		Replaced: s.repl.Load(), Invalid: s.invalid.Load(),
		Requeued: s.requeued.Load(), ReapedDead: s.reapedDead.Load(),
		ReapedFinished: s.reapedFinished.Load(), Orphans: s.orphans.Load(),
		Errors: s.errs.Load(), RetentionDeleted: s.retention.Load(),
		DivergencesFound: s.found.Load(), DivergencesRepaired: s.repaired.Load(),
		Passes: s.passes.Load(), RedisLosses: s.losses.Load(),
		Leader: s.leader.Load(), Lag: time.Duration(s.lag.Load()),
	}
}

// Stats returns the relay's counts since New.
func (r *Relay) Stats() Stats { return r.stats.snapshot() }

// observe sends e to the relay's observers.
func (r *Relay) observe(ctx context.Context, e Event) { r.obs.Observe(ctx, e) }
