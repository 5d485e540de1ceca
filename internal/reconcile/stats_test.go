package reconcile

import (
	"fmt"
	"testing"
	"time"

	"github.com/delayq/delayq/delayqtype"
)

// Above the size where Stats estimates (here 1,000 rows), the done and cancelled
// counts come from the planner's statistics and say so; the live and dead counts
// stay exact; ExactCounts counts every row. On a table smaller than ANALYZE's
// sample the statistics see every row, so the estimates equal the counts.
func TestStatsEstimatesFinishedRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	// 3,000 rows in three queues: a, b done and cancelled in different shares, c
	// with a queue of live rows only.
	if _, err := b.pool.Exec(ctx, `ALTER TABLE delayq_outbox SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	_, err := b.pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, done_at, queued_at)
SELECT q, 't' || i, now() - interval '1 minute', 'x', 1, s,
       CASE WHEN s IN ('done', 'dead', 'cancelled') THEN now() END,
       CASE WHEN s = 'queued' THEN now() END
FROM generate_series(1, 3000) AS i,
     LATERAL (SELECT CASE i % 3 WHEN 0 THEN 'a' WHEN 1 THEN 'b' ELSE 'c' END AS q) AS qq,
     LATERAL (SELECT CASE
        WHEN q = 'a' THEN (CASE WHEN i % 10 < 8 THEN 'done' WHEN i % 10 < 9 THEN 'cancelled' ELSE 'pending' END)
        WHEN q = 'b' THEN (CASE WHEN i % 10 < 5 THEN 'done' WHEN i % 10 < 7 THEN 'dead' ELSE 'queued' END)
        ELSE (CASE WHEN i % 10 < 6 THEN 'pending' ELSE 'queued' END) END AS s) AS ss`)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := b.pool.Query(ctx, `SELECT queue, state, count(*) FROM delayq_outbox GROUP BY queue, state`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[delayqtype.State]int64{}
	for rows.Next() {
		var q string
		var s delayqtype.State
		var n int64
		if err := rows.Scan(&q, &s, &n); err != nil {
			t.Fatal(err)
		}
		if want[q] == nil {
			want[q] = map[delayqtype.State]int64{}
			for _, st := range delayqtype.States() {
				want[q][st] = 0
			}
		}
		want[q][s] = n
	}
	if rows.Err() != nil || len(want) != 3 {
		t.Fatal(rows.Err(), want)
	}
	check := func(name string, o Options, estimated bool) {
		t.Helper()
		st, err := Stats(ctx, b.pool, b.dq, o)
		if err != nil {
			t.Fatal(err)
		}
		if len(st) != 3 {
			t.Fatalf("%s: %d queues", name, len(st))
		}
		for _, s := range st {
			if s.Estimated != estimated {
				t.Errorf("%s: %s: Estimated %v, want %v", name, s.Queue, s.Estimated, estimated)
			}
			if fmt.Sprint(s.Postgres) != fmt.Sprint(want[s.Queue]) {
				t.Errorf("%s: %s: %v, want %v", name, s.Queue, s.Postgres, want[s.Queue])
			}
		}
	}
	// No statistics yet (autovacuum kept away): every row is counted.
	check("before ANALYZE", Options{estimateAbove: 1000}, false)
	if _, err := b.pool.Exec(ctx, `ANALYZE delayq_outbox`); err != nil {
		t.Fatal(err)
	}
	check("estimated", Options{estimateAbove: 1000}, true)
	check("estimated, some queues", Options{estimateAbove: 1000, Queues: []string{"a", "b", "c"}}, true)
	check("exact", Options{estimateAbove: 1000, ExactCounts: true}, false)
	check("below the size", Options{}, false)
	// The estimate is the statistics', not a count: rows written since ANALYZE
	// show in the live counts at once, in the finished ones after the next.
	if _, err := b.pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'done', done_at = now() WHERE queue = 'c' AND state = 'queued'`); err != nil {
		t.Fatal(err)
	}
	want["c"][stateQueued] = 0
	st, err := Stats(ctx, b.pool, b.dq, Options{estimateAbove: 1000, Queues: []string{"c"}})
	if err != nil || len(st) != 1 || fmt.Sprint(st[0].Postgres) != fmt.Sprint(want["c"]) {
		t.Errorf("after an update: %+v %v, want %v", st, err, want["c"])
	}
	want["c"][stateDone] = 400
	check("exact after an update", Options{estimateAbove: 1000, ExactCounts: true}, false)
}
