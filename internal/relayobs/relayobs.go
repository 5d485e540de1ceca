// Package relayobs holds the relay's events: its Prometheus metrics, its Stats
// and the module's own tools (bench) observe every one of them; users see the
// few that package relay's Observer reports.
package relayobs

import (
	"context"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/reconcile"
)

// Observer receives a Relay's events: the Prometheus metrics
// (relay.Config.Registerer) are one Observer, the relay's Stats another.
// Observers combines several. Observe is called from the relay's loops,
// concurrently: it must be safe for concurrent use and return quickly. An
// Observer ignores the events it does not know. A relay.Config.Observer that also
// has this method gets every event (the module's own tools use it).
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

// multiObserver calls each of its Observers in turn.
type multiObserver []Observer

func (m multiObserver) Observe(ctx context.Context, e Event) {
	for _, o := range m {
		o.Observe(ctx, e)
	}
}
