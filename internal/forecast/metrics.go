package forecast

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// horizon is a value of the horizon label of delayq_forecast_due_tasks and a
// key of the endpoint's "due".
type horizon struct {
	label string
	d     time.Duration
}

// horizons are the forecast's horizons: 1m, 5m, 15m and 60m.
func horizons() []horizon {
	return []horizon{{"1m", time.Minute}, {"5m", 5 * time.Minute}, {"15m", 15 * time.Minute}, {"60m", time.Hour}}
}

// collector exports the last snapshot at each scrape (no store is read then):
//
//	delayq_forecast_due_tasks{queue,horizon}       tasks due within the next 1m, 5m, 15m, 60m
//	                                               (pending and queued rows; not those due already)
//	delayq_forecast_desired_workers{queue}         Params.Workers with the configured Params
//	delayq_forecast_age_seconds                    since the last successful refresh
//	delayq_forecast_refresh_duration_seconds       one refresh: both stores
//	delayq_forecast_refresh_errors_total           refreshes that failed
//
// A queue that left the forecast leaves the metrics with it.
type collector struct {
	f        *Forecaster
	due      *prometheus.Desc
	desired  *prometheus.Desc
	age      *prometheus.Desc
	duration prometheus.Histogram
	errors   prometheus.Counter
}

func newCollector(f *Forecaster) *collector {
	return &collector{
		f: f,
		due: prometheus.NewDesc("delayq_forecast_due_tasks",
			"Tasks due within the next horizon (1m, 5m, 15m, 60m) by queue: pending and queued outbox rows, not those due already; as of the last forecast refresh.",
			[]string{"queue", "horizon"}, nil),
		desired: prometheus.NewDesc("delayq_forecast_desired_workers",
			"Workers a queue needs over the next lead time (the relay's --forecast-lead), by the relay's --forecast-handling-time and --forecast-concurrency: the most any minute needs (0 while paused).",
			[]string{"queue"}, nil),
		age: prometheus.NewDesc("delayq_forecast_age_seconds",
			"Seconds since the forecast's last successful refresh (absent before the first).", nil, nil),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "delayq_forecast_refresh_duration_seconds",
			Help:    "Duration of one forecast refresh: the due rows counted in PostgreSQL, the backlog read from Redis.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "delayq_forecast_refresh_errors_total",
			Help: "Forecast refreshes that failed (the last forecast is served meanwhile, until it is stale).",
		}),
	}
}

func (c *collector) refreshed(d time.Duration, err error) {
	c.duration.Observe(d.Seconds())
	if err != nil {
		c.errors.Inc()
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.due
	ch <- c.desired
	ch <- c.age
	c.duration.Describe(ch)
	c.errors.Describe(ch)
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.duration.Collect(ch)
	c.errors.Collect(ch)
	s, ok := c.f.Last()
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, time.Since(s.At).Seconds())
	p := c.f.cfg.Params
	for i := range s.Queues {
		q := &s.Queues[i]
		for _, h := range horizons() {
			ch <- prometheus.MustNewConstMetric(c.due, prometheus.GaugeValue, float64(q.DueWithin(h.d)), q.Name, h.label)
		}
		ch <- prometheus.MustNewConstMetric(c.desired, prometheus.GaugeValue, float64(p.Workers(q)), q.Name)
	}
}
