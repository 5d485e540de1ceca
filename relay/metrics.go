package relay

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/promreg"
	"github.com/delayq/delayq/internal/relayobs"
)

// metrics are the relay's Prometheus collectors, registered on Config.Registerer:
//
//	delayq_relay_rows_total{result}             rows moved to Redis: added, duplicate
//	                                            (already there: a repeated round), replaced
//	                                            (a rescheduled task), invalid (set dead:
//	                                            Redis refuses it)
//	delayq_relay_batch_duration_seconds         one round: select, Redis write, update, commit
//	delayq_relay_lag_seconds                    age of the oldest pending row that is due
//	                                            (0 when the relay keeps up)
//	delayq_outbox_rows{state}                   outbox rows by state: pending, queued and dead
//	                                            exact up to 100,000; done and cancelled estimated
//	delayq_relay_reaped_total{result}           expired leases taken back: requeued, dead (out of
//	                                            attempts, dead in both stores), finished (the
//	                                            row had finished: removed from Redis), orphan
//	delayq_relay_errors_total{kind}             errors: postgres, redis, listen, reap, retention, stats
//	delayq_relay_retention_deleted_total        finished rows deleted by the retention
//	delayq_relay_divergences_total{kind,result} disagreements of Postgres and Redis the
//	                                            anti-entropy found and repaired, by kind
//	delayq_relay_redis_losses_total             Redis losses detected (a master without its
//	                                            epoch mark: restarted, flushed, failed over)
//	delayq_relay_repair_pass_age_seconds        age of the last complete anti-entropy pass
//	delayq_relay_heal_leader                    1 while this relay leads the self-healing
//	delayq_relay_overdue_tasks{queue}           tasks in Redis due more than OverdueAfter ago
//	                                            and not claimed
//
// It is the relay's Prometheus Observer. Relays (and workers) that share a
// Registerer share the collectors: counters add up, and a gauge shows what the relay
// that set it last saw.
type metrics struct {
	rows      *prometheus.CounterVec
	batch     prometheus.Histogram
	lag       prometheus.Gauge
	depth     *prometheus.GaugeVec
	reaped    *prometheus.CounterVec
	errs      *prometheus.CounterVec
	retention prometheus.Counter

	divergences *prometheus.CounterVec
	losses      prometheus.Counter
	passAge     *ageGauge
	leader      prometheus.Gauge
	overdue     *prometheus.GaugeVec
}

// newMetrics registers the relay's collectors on reg, or takes those registered
// there already.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{}
	var err error
	reg1 := func(c prometheus.Collector) prometheus.Collector {
		if err != nil {
			return c
		}
		var got prometheus.Collector
		if got, err = promreg.Register(reg, c); err != nil {
			err = fmt.Errorf("relay: register metrics: %w", err)
		}
		return got
	}
	m.rows, _ = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "delayq_relay_rows_total",
		Help: "Outbox rows moved to Redis, by result: added, duplicate (already in Redis), replaced (rescheduled), invalid (refused by Redis, set dead).",
	}, []string{"result"})).(*prometheus.CounterVec)
	m.batch, _ = reg1(prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "delayq_relay_batch_duration_seconds",
		Help:    "Duration of one relay round that moved rows: select, Redis write, update, commit.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
	})).(prometheus.Histogram)
	m.lag, _ = reg1(prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "delayq_relay_lag_seconds",
		Help: "Age of the oldest pending outbox row that is due (0 when none is).",
	})).(prometheus.Gauge)
	m.depth, _ = reg1(prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "delayq_outbox_rows",
		Help: "Outbox rows by state, refreshed every stats interval (15s): pending, queued and dead counted exactly up to 100,000 (more reads 100,000); done and cancelled estimated from the planner's statistics (as fresh as the last ANALYZE).",
	}, []string{"state"})).(*prometheus.GaugeVec)
	m.reaped, _ = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "delayq_relay_reaped_total",
		Help: "Expired leases taken back by the reaper, by result: requeued, dead (out of attempts), finished (the outbox row had finished: removed from Redis), orphan.",
	}, []string{"result"})).(*prometheus.CounterVec)
	m.errs, _ = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "delayq_relay_errors_total",
		Help: "Relay errors by kind: postgres, redis, listen, reap, retention, stats, heal.",
	}, []string{"kind"})).(*prometheus.CounterVec)
	m.retention, _ = reg1(prometheus.NewCounter(prometheus.CounterOpts{
		Name: "delayq_relay_retention_deleted_total",
		Help: "Finished outbox rows (done, cancelled) deleted after the retention.",
	})).(prometheus.Counter)
	m.divergences, _ = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "delayq_relay_divergences_total",
		Help: "Disagreements between PostgreSQL and Redis found by the anti-entropy pass, by kind, and how many it repaired (result found or repaired).",
	}, []string{"kind", "result"})).(*prometheus.CounterVec)
	m.losses, _ = reg1(prometheus.NewCounter(prometheus.CounterOpts{
		Name: "delayq_relay_redis_losses_total",
		Help: "Redis data losses detected: a master without its epoch mark (restarted without persistence, flushed, or failed over to a replica without it). Each starts a full repair.",
	})).(prometheus.Counter)
	m.passAge, _ = reg1(&ageGauge{desc: prometheus.NewDesc("delayq_relay_repair_pass_age_seconds",
		"Seconds since this relay completed its last anti-entropy pass (0 before the first, and on relays that do not lead).",
		nil, nil)}).(*ageGauge)
	m.leader, _ = reg1(prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "delayq_relay_heal_leader",
		Help: "1 while this relay leads the self-healing (loss detection and anti-entropy), else 0.",
	})).(prometheus.Gauge)
	m.overdue, _ = reg1(prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "delayq_relay_overdue_tasks",
		Help: "Tasks in Redis due more than OverdueAfter ago and not claimed, by queue, refreshed every StatsInterval. Tasks Redis lost count in delayq_relay_divergences_total until repaired.",
	}, []string{"queue"})).(*prometheus.GaugeVec)
	if err != nil {
		return nil, err
	}
	// Export every label value from the start, so dashboards see zeros.
	for _, r := range []string{"added", "duplicate", "replaced", "invalid"} {
		m.rows.WithLabelValues(r)
	}
	for _, r := range []string{"requeued", "dead", "finished", "orphan"} {
		m.reaped.WithLabelValues(r)
	}
	for _, k := range []string{errPostgres, errRedis, errListen, errReap, errRetention, errStats, errHeal} {
		m.errs.WithLabelValues(k)
	}
	return m, nil
}

// Error kinds, the label values of delayq_relay_errors_total.
const (
	errPostgres  = "postgres"
	errRedis     = "redis"
	errListen    = "listen"
	errReap      = "reap"
	errRetention = "retention"
	errStats     = "stats"
	errHeal      = "heal"
)

// Observe records e in the collectors.
func (m *metrics) Observe(_ context.Context, e relayobs.Event) {
	switch e := e.(type) {
	case relayobs.MoveEvent:
		m.rows.WithLabelValues("added").Add(float64(e.Added))
		m.rows.WithLabelValues("duplicate").Add(float64(e.Duplicate))
		m.rows.WithLabelValues("replaced").Add(float64(e.Replaced))
		m.rows.WithLabelValues("invalid").Add(float64(e.Invalid))
		m.batch.Observe(e.Duration.Seconds())
	case relayobs.ReapEvent:
		m.reaped.WithLabelValues("requeued").Add(float64(e.Requeued))
		m.reaped.WithLabelValues("dead").Add(float64(e.Dead))
		m.reaped.WithLabelValues("finished").Add(float64(e.Finished))
		m.reaped.WithLabelValues("orphan").Add(float64(e.Orphans))
	case relayobs.ErrorEvent:
		m.errs.WithLabelValues(e.Kind).Inc()
	case relayobs.RetentionEvent:
		m.retention.Add(float64(e.Deleted))
	case relayobs.DivergenceEvent:
		if e.Found > 0 {
			m.divergences.WithLabelValues(string(e.Kind), "found").Add(float64(e.Found))
		}
		if e.Repaired > 0 {
			m.divergences.WithLabelValues(string(e.Kind), "repaired").Add(float64(e.Repaired))
		}
	case relayobs.RedisLossEvent:
		m.losses.Inc()
	case relayobs.LeaderEvent:
		m.leader.Set(map[bool]float64{true: 1, false: 0}[e.Leading])
	case relayobs.PassEvent:
		m.passAge.last.Store(time.Now().UnixNano())
	case relayobs.LagEvent:
		m.lag.Set(e.Lag.Seconds())
	case relayobs.DepthEvent:
		for state, n := range map[delayqtype.State]int64{delayqtype.StatePending: e.Pending, delayqtype.StateQueued: e.Queued,
			delayqtype.StateDead: e.Dead, delayqtype.StateDone: e.Done, delayqtype.StateCancelled: e.Cancelled} {
			m.depth.WithLabelValues(string(state)).Set(float64(n))
		}
	case relayobs.OverdueEvent:
		m.overdue.WithLabelValues(e.Queue).Set(float64(e.Tasks))
	}
}

// ageGauge exports the seconds since a time (0 before it is set), as of the
// scrape.
type ageGauge struct {
	desc *prometheus.Desc
	last atomic.Int64 // Unix nanoseconds; 0: never
}

func (g *ageGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g *ageGauge) Collect(ch chan<- prometheus.Metric) {
	age := 0.0
	if last := g.last.Load(); last != 0 {
		age = time.Since(time.Unix(0, last)).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, age)
}
