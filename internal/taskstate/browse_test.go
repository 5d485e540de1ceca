package taskstate

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/internal/testenv"
)

// fillBrowse writes n rows over 20 queues, most of them finished, as in production.
func fillBrowse(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, done_at, last_error)
SELECT 'q' || (i % 20), 't' || i, now() + (i % 100) * interval '1 minute', 'x', 1,
       CASE WHEN i % 50 = 0 THEN 'pending' WHEN i % 50 = 1 THEN 'queued' WHEN i % 50 = 2 THEN 'dead'
            WHEN i % 50 = 3 THEN 'cancelled' ELSE 'done' END,
       CASE WHEN i % 50 IN (0, 1) THEN NULL ELSE now() - (i % 1000) * interval '1 minute' END,
       CASE WHEN i % 50 = 2 THEN 'boom' END
FROM generate_series(1, $1::int) AS i`, n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE delayq_outbox`); err != nil {
		t.Fatal(err)
	}
}

// Every list of the dashboard is an index scan, whatever the filter: checked with
// EXPLAIN on a table of 20,000 rows, most of them finished. (Where two indexes
// serve, either will do: the planner picks by the statistics.)
func TestBrowseQueriesUseIndexes(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	fillBrowse(t, pool, 20000)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := NewBrowse(Config{Schema: "public", NotifyChannel: "delayq_outbox"})
	now := time.Now()
	for _, tc := range []struct {
		name, sql string
		args      []any
		index     string
	}{
		{"task", b.Task, []any{"q1", "t1", 1000}, "delayq_outbox_pkey"},
		{"keys", b.Keys, []any{[]string{"q1", "q2"}, []string{"t1", "t2"}}, "delayq_outbox_pkey"},
		{"by id", b.ByID, []any{"q1", "", "", "", nil, nil, 50}, "delayq_outbox_pkey"},
		{"by id, next page", b.ByID, []any{"q1", "t5001", "", "", nil, nil, 50}, "delayq_outbox_pkey"},
		{"by id, prefix", b.ByID, []any{"q1", "", "t12", "", nil, nil, 50}, "delayq_outbox_pkey"},
		{"by id, state and due range", b.ByID, []any{"q1", "", "", "queued", now, now.Add(time.Hour), 50}, "delayq_outbox_pkey|delayq_outbox_queued_idx"},
		{"by id, waiting", b.ByID, []any{"q1", "", "", "waiting", nil, nil, 50}, "delayq_outbox_pkey|delayq_outbox_waiting_idx"},
		{"pending", b.Pending, []any{"", nil, "", "", nil, nil, 50}, "delayq_outbox_pending_run_at_idx"},
		{"pending of a queue, next page", b.Pending, []any{"q0", now, "q0", "t100", nil, nil, 50}, "delayq_outbox_pending_run_at_idx"},
		{"pending, due range", b.Pending, []any{"q0", nil, "", "", now, now.Add(time.Hour), 50}, "delayq_outbox_pending_run_at_idx"},
		{"dead", b.Finished, []any{"", "dead", nil, "", "", nil, nil, 50}, "delayq_outbox_dead_idx|delayq_outbox_done_at_idx"},
		{"dead of a queue, next page", b.Finished, []any{"q2", "dead", now, "q2", "t2", nil, nil, 50}, "delayq_outbox_dead_idx|delayq_outbox_done_at_idx|delayq_outbox_pkey"},
		{"done", b.Finished, []any{"q3", "done", nil, "", "", nil, nil, 50}, "delayq_outbox_done_at_idx"},
	} {
		p := explain(t, ctx, pool, tc.sql, tc.args...)
		uses := false
		for _, index := range strings.Split(tc.index, "|") {
			uses = uses || strings.Contains(p, index)
		}
		if !uses || strings.Contains(p, "Seq Scan") {
			t.Errorf("%s: plan does not use %s alone:\n%s", tc.name, tc.index, p)
		}
	}
}

func explain(t *testing.T, ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) string {
	t.Helper()
	rows, err := pool.Query(ctx, "EXPLAIN "+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	return strings.Join(plan, "\n")
}

// Walking a list page by page visits every matching row once, in order.
func TestBrowseKeysetPages(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	fillBrowse(t, pool, 2000)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := NewBrowser(Config{Schema: "public", NotifyChannel: "delayq_outbox"})
	count := func(where string, args ...any) int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE `+where, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, tc := range []struct {
		f    Filter
		want int
	}{
		{Filter{Queue: "q0"}, count(`queue = 'q0'`)},
		{Filter{Queue: "q1", Prefix: "t1"}, count(`queue = 'q1' AND task_id LIKE 't1%'`)},
		{Filter{Queue: "q1", State: Queued}, count(`queue = 'q1' AND state = 'queued'`)},
		{Filter{State: Pending}, count(`state = 'pending'`)},
		{Filter{Queue: "q0", State: Pending, DueBefore: time.Now().Add(30 * time.Minute)}, count(`queue = 'q0' AND state = 'pending' AND run_at < now() + interval '30 minutes'`)},
		{Filter{State: Dead}, count(`state = 'dead'`)},
		{Filter{Queue: "q3", State: Cancelled}, count(`queue = 'q3' AND state = 'cancelled'`)},
		{Filter{State: Done}, count(`state = 'done'`)},
	} {
		t.Run(fmt.Sprintf("%+v", tc.f), func(t *testing.T) {
			if tc.want == 0 {
				t.Fatal("the fixture has no such row")
			}
			seen := map[string]bool{}
			var cur Cursor
			var prev BrowseRow
			for page := 0; ; page++ {
				rows, next, err := b.List(ctx, pool, tc.f, cur, 7)
				if err != nil {
					t.Fatal(err)
				}
				for i, r := range rows {
					k := r.Queue + "/" + r.ID
					if seen[k] {
						t.Fatalf("page %d: %s twice", page, k)
					}
					seen[k] = true
					if tc.f.State != "" && r.State != tc.f.State || tc.f.Queue != "" && r.Queue != tc.f.Queue ||
						!strings.HasPrefix(r.ID, tc.f.Prefix) {
						t.Fatalf("page %d: %+v does not match", page, r)
					}
					if (page > 0 || i > 0) && tc.f.State == Pending && r.RunAt.Before(prev.RunAt) {
						t.Fatalf("page %d: out of due order: %v after %v", page, r.RunAt, prev.RunAt)
					}
					if (page > 0 || i > 0) && tc.f.State == Done && r.DoneAt.After(prev.DoneAt) {
						t.Fatalf("page %d: out of order: %v after %v", page, r.DoneAt, prev.DoneAt)
					}
					prev = r
				}
				if next == (Cursor{}) {
					break
				}
				cur = next
			}
			if len(seen) != tc.want {
				t.Fatalf("visited %d rows, want %d", len(seen), tc.want)
			}
		})
	}
	row, ok, err := b.Task(ctx, pool, "q2", "t2", 0)
	if err != nil || !ok || row.State != Dead || row.LastError != "boom" || row.PayloadBytes != 1 || len(row.Payload) != 0 {
		t.Fatalf("task: %+v %v %v", row, ok, err)
	}
	if _, ok, err := b.Task(ctx, pool, "q2", "nope", 10); ok || err != nil {
		t.Fatalf("missing task: %v %v", ok, err)
	}
}
