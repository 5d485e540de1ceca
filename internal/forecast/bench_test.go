package forecast_test

import (
	"context"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/forecast"
)

// BenchmarkRefresh is one refresh (the due rows counted in Postgres, the
// backlog read from Redis) on an outbox of 1,000,000 rows, in three layouts:
//
//	retained: 900,000 finished rows (the retention window), 90,000 queued due
//	          within the hour (the relay's default horizon), 10,000 pending due
//	          over the next day: what a busy outbox holds;
//	pending:  1,000,000 pending rows due over the next 10 hours (a relay with a
//	          short --horizon): 100,000 in the hour;
//	queued:   1,000,000 queued rows due within the hour: every row read.
//
// The rows are vacuumed first, as autovacuum leaves a table of that size.
func BenchmarkRefresh(b *testing.B) {
	if testing.Short() {
		b.Skip("1,000,000 rows")
	}
	for _, l := range []struct {
		name                  string
		done, queued, pending int
		pendingOver           time.Duration
	}{
		{"retained", 900_000, 90_000, 10_000, 24 * time.Hour},
		{"pending", 0, 0, 1_000_000, 10 * time.Hour},
		{"queued", 0, 1_000_000, 0, 0},
	} {
		b.Run(l.name, func(b *testing.B) {
			bnd := setup(b, forecast.Config{Timeout: time.Minute})
			ctx := context.Background()
			at := time.Now()
			// 20 queues; due times spread evenly over their window.
			_, err := bnd.pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, queued_at, done_at)
SELECT 'q' || (i % 20), 'd' || i, $1::timestamptz - interval '1 hour' + i * interval '1 millisecond', '{"order":"12345678"}'::bytea, 25, 'done', $1, $1
FROM generate_series(1, $2::int) AS i
UNION ALL
SELECT 'q' || (i % 20), 'q' || i, $1::timestamptz + (i::float8 / $3) * interval '1 hour', '{"order":"12345678"}'::bytea, 25, 'queued', $1, NULL
FROM generate_series(1, $3::int) AS i
UNION ALL
SELECT 'q' || (i % 20), 'p' || i, $1::timestamptz + (i::float8 / $4) * $5::bigint * interval '1 microsecond', '{"order":"12345678"}'::bytea, 25, 'pending', NULL, NULL
FROM generate_series(1, $4::int) AS i`, at, l.done, l.queued, l.pending, l.pendingOver.Microseconds())
			if err != nil {
				b.Fatal(err)
			}
			if _, err := bnd.pool.Exec(ctx, "VACUUM ANALYZE delayq_outbox"); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if err := bnd.f.RefreshAt(ctx, at); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			s, _ := bnd.f.Last()
			var due int64
			for i := range s.Queues {
				due += s.Queues[i].DueWithin(time.Hour)
			}
			b.ReportMetric(float64(due), "due_in_hour")
		})
	}
}
