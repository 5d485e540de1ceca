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
//	delayq_outbox_rows{state}                   outbox rows by state
//	delayq_relay_reaped_total{result}           expired leases taken back: requeued, dead (out of
//	                                            attempts, dead in both stores), finished (the
//	                                            row had finished: removed from Redis), orphan
//	delayq_relay_errors_total{kind}             errors: postgres, redis, listen, reap, retention, stats
//	delayq_relay_retention_deleted_total        finished rows deleted by the retention
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
}

func newMetrics() *metrics {
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
			Help: "Outbox rows by state (pending and queued refreshed every stats interval, finished states every tenth).",
		}, []string{"state"}),
		reaped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "delayq_relay_reaped_total",
			Help: "Expired leases taken back by the reaper, by result: requeued, dead (out of attempts), finished (the outbox row had finished: removed from Redis), orphan.",
		}, []string{"result"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "delayq_relay_errors_total",
			Help: "Relay errors by kind: postgres, redis, listen, reap, retention, stats.",
		}, []string{"kind"}),
		retention: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "delayq_relay_retention_deleted_total",
			Help: "Finished outbox rows (done, cancelled) deleted after the retention.",
		}),
	}
	// Export every label value from the start, so dashboards see zeros.
	for _, r := range []string{"added", "duplicate", "replaced", "invalid"} {
		m.rows.WithLabelValues(r)
	}
	for _, r := range []string{"requeued", "dead", "orphan"} {
		m.reaped.WithLabelValues(r)
	}
	for _, k := range []string{errPostgres, errRedis, errListen, errReap, errRetention, errStats} {
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
)

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.rows, m.batch, m.lag, m.depth, m.reaped, m.errs, m.retention}
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
