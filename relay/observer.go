package relay

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/delayq/delayq/internal/relayobs"
)

// Observer receives a Relay's events, as delayq.Observer receives a worker's: a
// method for each kind of event, called from the relay's loops, concurrently, so
// it must be safe for concurrent use and return quickly. An OpenTelemetry tracer
// (package delayqotel) is one. The relay's counts are in Stats and its Prometheus
// metrics come with Config.Registerer.
type Observer interface {
	// Move is called after each round that moved tasks into Redis committed.
	Move(ctx context.Context, e MoveEvent)
}

// MoveEvent is one round that moved rows to Redis and committed.
type MoveEvent struct {
	// Added, Duplicate (already in Redis: a repeated round), Replaced (a
	// rescheduled task) and Invalid (refused by Redis, set dead) count the rows.
	Added, Duplicate, Replaced, Invalid int
	// Tasks are the tasks written to Redis (Invalid rows are not among them). The
	// Observer must not change or keep the slice.
	Tasks []MovedTask
	// Start is when the round began; Duration covers select, Redis write, update
	// and commit.
	Start    time.Time
	Duration time.Duration
}

// MovedTask is one task a round moved to Redis.
type MovedTask struct {
	Queue, ID string
	// TraceContext is the task's W3C traceparent, empty when it has none.
	TraceContext string
}

// userObserver adapts Config.Observer to the relay's events.
type userObserver struct{ o Observer }

// observerOf returns the relayobs.Observer of o: o itself when it has the
// method (the module's tools observe every event), else an adapter.
func observerOf(o Observer) relayobs.Observer {
	switch o := o.(type) {
	case nil:
		return nil
	case relayobs.Observer:
		return o
	}
	return userObserver{o}
}

// Observe passes the events the Observer has a method for.
func (u userObserver) Observe(ctx context.Context, e relayobs.Event) {
	m, ok := e.(relayobs.MoveEvent)
	if !ok {
		return
	}
	me := MoveEvent{Added: m.Added, Duplicate: m.Duplicate, Replaced: m.Replaced, Invalid: m.Invalid,
		Start: m.Start, Duration: m.Duration}
	for _, qt := range m.Tasks {
		for _, t := range qt.Tasks {
			me.Tasks = append(me.Tasks, MovedTask{Queue: qt.Queue, ID: t.ID, TraceContext: t.TraceContext})
		}
	}
	u.o.Move(ctx, me)
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

func (s *statsObserver) Observe(_ context.Context, e relayobs.Event) {
	switch e := e.(type) {
	case relayobs.MoveEvent:
		s.rounds.Add(1)
		s.added.Add(int64(e.Added))
		s.dup.Add(int64(e.Duplicate))
		s.repl.Add(int64(e.Replaced))
		s.invalid.Add(int64(e.Invalid))
	case relayobs.ReapEvent:
		s.requeued.Add(int64(e.Requeued))
		s.reapedDead.Add(int64(e.Dead))
		s.reapedFinished.Add(int64(e.Finished))
		s.orphans.Add(int64(e.Orphans))
	case relayobs.ErrorEvent:
		s.errs.Add(1)
	case relayobs.RetentionEvent:
		s.retention.Add(e.Deleted)
	case relayobs.DivergenceEvent:
		s.found.Add(int64(e.Found))
		s.repaired.Add(int64(e.Repaired))
	case relayobs.RedisLossEvent:
		s.losses.Add(1)
	case relayobs.LeaderEvent:
		s.leader.Store(e.Leading)
	case relayobs.PassEvent:
		s.passes.Add(1)
	case relayobs.LagEvent:
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
func (r *Relay) observe(ctx context.Context, e relayobs.Event) { r.obs.Observe(ctx, e) }
