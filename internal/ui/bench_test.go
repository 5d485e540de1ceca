package ui

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/schedule"
	"github.com/delayq/delayq/workflow"
)

// BenchmarkPages renders each page over an outbox of DELAYQ_UI_BENCH_ROWS rows
// (default 20,000, so that make test stays quick; BENCHMARKS.md has the figures
// at 1,000,000) in 20 queues: 90% done, 4% pending, 3% queued, 2% dead, 1%
// cancelled, as a table with a week of history looks; every queue has an hour of
// Redis history (the queues page's charts) and a pause flag row; 50 schedules
// and 20 worker processes for their pages.
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
	// 50 schedules, each with its last tick's task (a tenth of them dead), and
	// 20 worker processes with 100 runs in flight each (the registry's most).
	last := now.Truncate(time.Hour)
	for i := range 50 {
		name := "schedule-" + strconv.Itoa(i)
		id := schedule.TaskID(schedule.Schedule{Name: name}, last)
		state := "done"
		if i%10 == 0 {
			state = "dead"
		}
		if _, err := pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, done_at, last_error)
VALUES ('queue-1', $1, $2, '{}', 25, $3, $2, CASE WHEN $3 = 'dead' THEN 'smtp refused' END)`, id, last, state); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO delayq_schedules (name, queue, spec, time_zone, last_tick, last_enqueued, next_tick, enqueued, missed)
VALUES ($1, 'queue-1', 'cron 0 * * * *', 'Europe/Paris', $2, $2, $2::timestamptz + interval '1 hour', 100, 1)`, name, last); err != nil {
			b.Fatal(err)
		}
	}
	for p := range 20 {
		w := delayqtype.Worker{ID: "worker-" + strconv.Itoa(p), Host: "host-" + strconv.Itoa(p%4), PID: 1000 + p, Version: "v0.0.0",
			Queues: map[string]int{"queue-1": 50, "queue-2": 50}, InFlight: 100}
		w.Running = make([]struct {
			Queue     string    `json:"queue"`
			ID        string    `json:"id"`
			Attempt   int       `json:"attempt"`
			ClaimedAt time.Time `json:"claimed_at"`
		}, 100)
		for r := range w.Running {
			w.Running[r].Queue, w.Running[r].ID, w.Running[r].Attempt, w.Running[r].ClaimedAt = "queue-1", "task-"+strconv.Itoa(p*100+r), 1, now
		}
		if _, err := dq.BeatWorker(ctx, w, time.Minute, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	// A workflow: a chain of 100 tasks and a task with 10,000 dependents, the
	// task page's dependencies, dependents and walk.
	wf := workflow.New(ob)
	chain := make([]outbox.Task, 100)
	for i := range chain {
		chain[i] = outbox.Task{Queue: "wf", ID: fmt.Sprintf("chain-%03d", i)}
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := wf.Chain(ctx, tx, workflow.Fail, chain...); err != nil {
			return err
		}
		if _, err := ob.Enqueue(ctx, tx, outbox.Task{Queue: "wf", ID: "root"}); err != nil {
			return err
		}
		for i := range 10000 {
			if _, err := wf.Enqueue(ctx, tx, outbox.Task{Queue: "wf", ID: fmt.Sprintf("leaf-%05d", i)}, workflow.On("wf", "root")); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE delayq_deps`); err != nil {
		b.Fatal(err)
	}
	h, err := New(Config{DB: pool, Redis: dq, Outbox: ob, ReadOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	// The bulk actions' previews need an authenticated dashboard (a bearer
	// token: no CSRF token), as does the list with its bulk form.
	const benchToken = "bench-token-0123456789abcdef"
	act, err := New(Config{DB: pool, Redis: dq, Outbox: ob, Token: benchToken})
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
		{"task waiting in a chain of 100 (its workflow walked)", "/task?queue=wf&id=chain-050"},
		{"task with 10,000 dependents (100 listed, a walk of 500)", "/task?queue=wf&id=root"},
		// Each queue holds one state (queue-n: its rows' i % 100 all fall in one
		// band): queue-3 50,000 done rows, queue-10 10,000 pending, queue-14
		// 10,000 queued, queue-17 10,000 dead.
		{"tasks by created time, 50,000 rows (stopped at the time limit)", "/tasks?queue=queue-3&sort=created"},
		{"tasks pending by created time, 10,000 rows", "/tasks?queue=queue-10&state=pending&sort=created"},
		{"tasks dead by created time, 10,000 rows", "/tasks?queue=queue-17&state=dead&sort=created"},
		{"tasks queued by due time, 10,000 rows", "/tasks?queue=queue-14&state=queued&sort=due"},
		{"tasks by finish time, every state", "/tasks?queue=queue-17&sort=finished"},
		{"search by payload (10,000 rows a page at most), every row found", "/tasks?queue=queue-3&path=order_id&value=12345"},
		{"search by payload, no match", "/tasks?queue=queue-3&path=order_id&value=999"},
		{"workers, 20 processes with 100 runs each", "/workers"},
		{"schedules, 50 with their last tick's task", "/schedules"},
		{"tasks pending, with the bulk form (logged in)", "/tasks?queue=queue-10&state=pending"},
		// A bulk action's preview reads at most 10,001 rows of the filter (50,000
		// by payload search): what an action on every matching task costs to
		// count.
		{"bulk preview: cancel every pending task of a queue, 10,000 rows", "/action/bulk?action=cancel&scope=filter&queue=queue-10&state=pending"},
		{"bulk preview: cancel in a queue of 50,000 done rows (reads 10,001, all skipped)", "/action/bulk?action=cancel&scope=filter&queue=queue-3"},
		{"bulk preview: retry the dead letters of a queue, 10,000 rows", "/action/bulk?action=retry&scope=filter&kind=dead&queue=queue-17"},
		{"bulk preview: cancel what a search by payload finds (50,000 rows read)", "/action/bulk?action=cancel&scope=filter&queue=queue-3&path=order_id&value=999"},
	} {
		b.Run(page.name, func(b *testing.B) {
			for b.Loop() {
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodGet, page.path, nil)
				if path, form, ok := strings.Cut(page.path, "?"); ok && strings.HasPrefix(path, "/action/") {
					req = httptest.NewRequest(http.MethodPost, path, strings.NewReader(form))
					req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				}
				if req.Method == http.MethodPost || strings.Contains(page.name, "logged in") {
					req.Header.Set("Authorization", "Bearer "+benchToken)
					act.ServeHTTP(rec, req)
				} else {
					h.ServeHTTP(rec, req)
				}
				if rec.Code != http.StatusOK {
					b.Fatalf("%s: %d\n%s", page.path, rec.Code, rec.Body.String())
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/page")
		})
	}
}
