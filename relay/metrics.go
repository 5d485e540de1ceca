package relay

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
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
// Several relays may run in one process only with different registerers (or nil).
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
	passAge     prometheus.GaugeFunc
	leader      prometheus.Gauge
	overdue     *prometheus.GaugeVec
}

func newMetrics(passAge func() float64) *metrics {
	m := &metrics{
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "delayq_relay_rows_total",
			Help: "Outbox rows moved to Redis, by result: added, duplicate (already in Redis), replaced (rescheduled), invalid (refused by Redis, set dead).",
		}, []string{"result"}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "delayq_relay_batch_duration_seconds",
			Help:    "Duration of one relay round that moved rows: select, Redis write, update, commit.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "delayq_relay_lag_seconds",
			Help: "Age of the oldest pending outbox row that is due (0 when none is).",
		}),
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "delayq_outbox_rows",
			Help: "Outbox rows by state, refreshed every stats interval (15s): pending, queued and dead counted exactly up to 100,000 (more reads 100,000); done and cancelled estimated from the planner's statistics (as fresh as the last ANALYZE).",
		}, []string{"state"}),
		reaped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "delayq_relay_reaped_total",
			Help: "Expired leases taken back by the reaper, by result: requeued, dead (out of attempts), finished (the outbox row had finished: removed from Redis), orphan.",
		}, []string{"result"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "delayq_relay_errors_total",
			Help: "Relay errors by kind: postgres, redis, listen, reap, retention, stats, heal.",
		}, []string{"kind"}),
		retention: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "delayq_relay_retention_deleted_total",
			Help: "Finished outbox rows (done, cancelled) deleted after the retention.",
		}),
		divergences: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "delayq_relay_divergences_total",
			Help: "Disagreements between PostgreSQL and Redis found by the anti-entropy pass, by kind, and how many it repaired (result found or repaired).",
		}, []string{"kind", "result"}),
		losses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "delayq_relay_redis_losses_total",
			Help: "Redis data losses detected: a master without its epoch mark (restarted without persistence, flushed, or failed over to a replica without it). Each starts a full repair.",
		}),
		passAge: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "delayq_relay_repair_pass_age_seconds",
			Help: "Seconds since this relay completed its last anti-entropy pass (0 before the first, and on relays that do not lead).",
		}, passAge),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "delayq_relay_heal_leader",
			Help: "1 while this relay leads the self-healing (loss detection and anti-entropy), else 0.",
		}),
		overdue: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "delayq_relay_overdue_tasks",
			Help: "Tasks in Redis due more than OverdueAfter ago and not claimed, by queue, refreshed every StatsInterval. Tasks Redis lost count in delayq_relay_divergences_total until repaired.",
		}, []string{"queue"}),
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
	return m
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

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.rows, m.batch, m.lag, m.depth, m.reaped, m.errs, m.retention,
		m.divergences, m.losses, m.passAge, m.leader, m.overdue}
}

func (m *metrics) register(r prometheus.Registerer) error {
	if r == nil {
		return nil
	}
	var done []prometheus.Collector
	for _, c := range m.collectors() {
		if err := r.Register(c); err != nil {
			for _, d := range done {
				r.Unregister(d)
			}
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return fmt.Errorf("%w: Registerer holds the relay metrics already (one relay per registry): %w", ErrInvalidConfig, err)
			}
			return fmt.Errorf("relay: register metrics: %w", err)
		}
		done = append(done, c)
	}
	return nil
}
