package ui

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

// BenchmarkPages renders each page over an outbox of DELAYQ_UI_BENCH_ROWS rows
// (default 20,000, so that make test stays quick; BENCHMARKS.md has the figures
// at 1,000,000) in 20 queues: 90% done, 4% pending, 3% queued, 2% dead, 1%
// cancelled, as a table with a week of history looks; every queue has an hour of
// Redis history (the queues page's charts) and a pause flag row.
//
//	DELAYQ_UI_BENCH_ROWS=1000000 go test -run '^$' -bench BenchmarkPages -benchtime 20x ./internal/ui
func BenchmarkPages(b *testing.B) {
	rows := 20000
	if v, err := strconv.Atoi(os.Getenv("DELAYQ_UI_BENCH_ROWS")); err == nil && v > 0 {
		rows = v
	}
	pool := testenv.Postgres(b)
	rdb, prefix := testenv.Redis(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	_, err := pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, done_at, last_error, queued_at)
SELECT 'queue-' || (i % 20), 'task-' || lpad(i::text, 8, '0'), now() - interval '7 days' + (i % 20160) * interval '1 minute' , '{"order_id":12345,"amount_cents":4200}', 25,
       s.state,
       CASE WHEN s.state IN ('pending', 'queued') THEN NULL ELSE now() - (i % 10080) * interval '1 minute' END,
       CASE WHEN s.state = 'dead' THEN 'card declined' END,
       CASE WHEN s.state = 'queued' THEN now() END
FROM generate_series(1, $1::int) AS i,
     LATERAL (SELECT CASE WHEN i % 100 < 90 THEN 'done' WHEN i % 100 < 94 THEN 'pending' WHEN i % 100 < 97 THEN 'queued'
                          WHEN i % 100 < 99 THEN 'dead' ELSE 'cancelled' END AS state) AS s`, rows)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE delayq_outbox`); err != nil {
		b.Fatal(err)
	}
	b.Logf("%d rows written in %v", rows, time.Since(start).Round(time.Millisecond))
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		b.Fatal(err)
	}
	// An hour of history in every queue, as busy workers leave it: tasks done and
	// claims in a dozen lateness buckets each minute (the shape the claim and
	// complete scripts write).
	now := time.Now()
	for q := range 20 {
		k, err := dq.Keys("queue-" + strconv.Itoa(q))
		if err != nil {
			b.Fatal(err)
		}
		pipe := rdb.Pipeline()
		for m := now.Unix()/60 - 59; m <= now.Unix()/60; m++ {
			key := k.History + strconv.FormatInt(m, 10)
			pipe.HIncrBy(ctx, key, "d", 3000)
			for bucket := 20; bucket < 32; bucket++ {
				pipe.HIncrBy(ctx, key, "l"+strconv.Itoa(bucket), int64(250+bucket))
			}
			pipe.Expire(ctx, key, dispatch.HistoryRetention)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
	h, err := New(Config{DB: pool, Redis: dq, Outbox: ob, ReadOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	mid := "task-" + strconv.Itoa(rows/2 + 1000000000)[2:]
	for _, page := range []struct{ name, path string }{
		{"queues", "/"},
		{"tasks by id", "/tasks?queue=queue-3"},
		{"tasks by id, page in the middle", "/tasks?queue=queue-3&cid=" + mid},
		{"tasks by id prefix", "/tasks?queue=queue-3&prefix=task-0000"},
		{"tasks queued", "/tasks?queue=queue-3&state=queued"},
		{"tasks pending by due time", "/tasks?queue=queue-3&state=pending"},
		{"tasks done, latest first", "/tasks?queue=queue-3&state=done"},
		{"dead letters", "/dead"},
		{"dead letters of a queue", "/dead?queue=queue-3"},
		{"task", "/task?queue=queue-3&id=task-00000003"},
	} {
		b.Run(page.name, func(b *testing.B) {
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, page.path, nil))
				if rec.Code != http.StatusOK {
					b.Fatalf("%s: %d\n%s", page.path, rec.Code, rec.Body.String())
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/page")
		})
	}
}
