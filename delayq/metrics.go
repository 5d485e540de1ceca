package delayq

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delayq/delayq/internal/promreg"
)

// RunStats are the counts of one Client's handlers since New, summed over its queues.
type RunStats struct {
	// Claimed tasks: every run started.
	Claimed int64
	// Succeeded runs: the handler returned nil and the task was marked done.
	Succeeded int64
	// Failed runs: the handler returned an error or panicked (then Retried or Dead,
	// unless the lease was lost or the outbox had finished the task elsewhere).
	Failed int64
	// Retried failures, given back to Redis to run again after a backoff.
	Retried int64
	// Dead failures: out of attempts or NoRetry; dead in Postgres and Redis.
	Dead int64
	// Suppressed runs: the outbox guard refused to mark the task done (or failed)
	// because it was already done, dead or cancelled; the handler's transaction was
	// rolled back and Redis acknowledged. Each is a duplicate delivery whose effect
	// was not applied twice.
	Suppressed int64
	// LeaseLost runs: the worker found that it no longer held the task's lease
	// (a heartbeat or an ack was refused).
	LeaseLost int64
	// Released runs: interrupted by shutdown, lease given back, to run again at once.
	Released int64
	// Snoozed runs: given back, uncounted, to run again later (Snooze, or an
	// OnDead hook that failed).
	Snoozed int64
	// Cancelled runs: the handler cancelled its task (Cancel).
	Cancelled int64
	// DeadHookFailed: deaths rolled back because the queue's OnDead hook failed
	// (each also counts as Snoozed).
	DeadHookFailed int64
	// MissedDeadline: tasks claimed after their start deadline, not run, dead
	// with the reason (each also counts as Dead).
	MissedDeadline int64
	// SweptDeadHooks: OnDead hooks the worker's sweep ran and committed for
	// deaths recorded without them (the reaper's, the relay's); SweptDeadHookFailed:
	// such hooks that failed, their marks kept for a later sweep.
	SweptDeadHooks, SweptDeadHookFailed int64
	// InFlight is the number of handlers running now.
	InFlight int64
}

type counters struct {
	claimed, succeeded, failed, retried, dead, suppressed, leaseLost, released, inFlight atomic.Int64
	snoozed, cancelled, deadHookFailed, missedDeadline                                   atomic.Int64
	sweptHooks, sweptHookFailed                                                          atomic.Int64
}

func (c *counters) snapshot() RunStats {
	return RunStats{
		Claimed: c.claimed.Load(), Succeeded: c.succeeded.Load(), Failed: c.failed.Load(),
		Retried: c.retried.Load(), Dead: c.dead.Load(), Suppressed: c.suppressed.Load(),
		LeaseLost: c.leaseLost.Load(), Released: c.released.Load(), InFlight: c.inFlight.Load(),
		Snoozed: c.snoozed.Load(), Cancelled: c.cancelled.Load(), DeadHookFailed: c.deadHookFailed.Load(),
		MissedDeadline: c.missedDeadline.Load(),
		SweptDeadHooks: c.sweptHooks.Load(), SweptDeadHookFailed: c.sweptHookFailed.Load(),
	}
}

// promObserver is the Observer behind Config.Registerer: the Prometheus
// collectors, labelled by queue.
type promObserver struct {
	events     *prometheus.CounterVec // labels: queue, outcome
	inFlight   *prometheus.GaugeVec
	lateness   *prometheus.HistogramVec
	processing *prometheus.HistogramVec
	deadHooks  *prometheus.CounterVec // labels: queue, result
}

// deadHook counts a hook the sweep ran for a death recorded without it.
func (m *promObserver) deadHook(queue string, ran bool) {
	if m == nil {
		return
	}
	result := "failed"
	if ran {
		result = "ran"
	}
	m.deadHooks.WithLabelValues(queue, result).Inc()
}

// Values of the outcome label of delayq_worker_tasks_total.
const (
	evClaimed   = "claimed"
	evFailed    = "failed"
	evLeaseLost = "lease_lost"
)

// promOutcome is the label value of the outcomes that have one of their own
// (lease_lost and failed are counted from RunEndEvent's other fields).
func promOutcome(o Outcome) string {
	switch o {
	case OutcomeSucceeded, OutcomeRetried, OutcomeDead, OutcomeReleased, OutcomeSnoozed, OutcomeCancelled, OutcomeMissedDeadline:
		return string(o)
	case OutcomeSuppressed:
		return "suppressed_duplicate"
	}
	return ""
}

// newPromObserver registers the worker's collectors on reg, or takes those another
// Worker of the process registered there already: workers share a registry.
func newPromObserver(reg prometheus.Registerer) (*promObserver, error) {
	events := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "delayq", Subsystem: "worker", Name: "tasks_total",
		Help: "Task runs by outcome: claimed, succeeded, failed, retried, dead, suppressed_duplicate, lease_lost, released, snoozed, cancelled, missed_deadline.",
	}, []string{"queue", "outcome"})
	inFlight := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "delayq", Subsystem: "worker", Name: "in_flight",
		Help: "Handlers running now.",
	}, []string{"queue"})
	lateness := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "delayq", Subsystem: "worker", Name: "claim_lateness_seconds",
		Help:    "Claim time minus due time, both by the Redis clock.",
		Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
	}, []string{"queue"})
	processing := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "delayq", Subsystem: "worker", Name: "processing_seconds",
		Help:    "Time from the start of a handler to the end of its bookkeeping (commit, ack).",
		Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
	}, []string{"queue"})
	deadHooks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "delayq", Subsystem: "worker", Name: "swept_dead_hooks_total",
		Help: "OnDead hooks the worker's sweep ran for deaths recorded without them (the reaper's, the relay's), by result: ran (committed with the clearing of the mark), failed (the mark kept for a later sweep).",
	}, []string{"queue", "result"})
	m := &promObserver{}
	var err error
	if m.events, err = promreg.Register(reg, events); err != nil {
		return nil, err
	}
	if m.inFlight, err = promreg.Register(reg, inFlight); err != nil {
		return nil, err
	}
	if m.lateness, err = promreg.Register(reg, lateness); err != nil {
		return nil, err
	}
	if m.processing, err = promreg.Register(reg, processing); err != nil {
		return nil, err
	}
	if m.deadHooks, err = promreg.Register(reg, deadHooks); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *promObserver) Claim(context.Context, ClaimEvent) {}

func (m *promObserver) RunStart(ctx context.Context, t *Task) context.Context {
	m.events.WithLabelValues(t.Queue, evClaimed).Inc()
	m.lateness.WithLabelValues(t.Queue).Observe(max(t.ClaimedAt.Sub(later(t.Due, t.Resumed)), 0).Seconds())
	m.inFlight.WithLabelValues(t.Queue).Inc()
	return ctx
}

func (m *promObserver) RunEnd(_ context.Context, t *Task, e RunEndEvent) {
	m.inFlight.WithLabelValues(t.Queue).Dec()
	m.processing.WithLabelValues(t.Queue).Observe(e.Duration.Seconds())
	if e.Err != nil {
		m.events.WithLabelValues(t.Queue, evFailed).Inc()
	}
	if e.LeaseLost {
		m.events.WithLabelValues(t.Queue, evLeaseLost).Inc()
	}
	if label := promOutcome(e.Outcome); label != "" {
		m.events.WithLabelValues(t.Queue, label).Inc()
	}
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
