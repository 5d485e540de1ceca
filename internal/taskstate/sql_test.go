package taskstate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/delayq/delayq/internal/testenv"
)

// The statements of the hot paths are served by the outbox's partial indexes, not by
// reading the table: checked with EXPLAIN on a table of 20,000 rows, most of them
// finished, as in production.
func TestQueriesUseIndexes(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, done_at)
SELECT 'q' || (i % 20), 't' || i, now() + (i % 100) * interval '1 minute', 'x', 1,
       CASE WHEN i % 50 = 0 THEN 'pending' WHEN i % 50 = 1 THEN 'queued' WHEN i % 50 = 2 THEN 'dead' ELSE 'done' END,
       CASE WHEN i % 50 IN (0, 1) THEN NULL ELSE now() - (i % 30) * interval '1 day' END
FROM generate_series(1, 20000) AS i`)
	if err != nil {
		t.Fatal(err)
	}
	// Half the dead rows (those of q2) wait for their OnDead hook.
	if _, err := pool.Exec(ctx, `UPDATE delayq_outbox SET hook_due = done_at WHERE state = 'dead' AND queue = 'q2'`); err != nil {
		t.Fatal(err)
	}
	// VACUUM sets the visibility map, as autovacuum does on a table of this size:
	// the counts read their partial indexes alone.
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE delayq_outbox`); err != nil {
		t.Fatal(err)
	}
	st := NewStatements(Config{Schema: "public", NotifyChannel: "delayq_outbox"})
	hour := time.Hour.Microseconds()
	// The ctids of 100 pending rows, as a round holds them. (For a round of 1000
	// the planner rightly reads this small table whole; on a table of millions it
	// takes the TID scan.)
	rows, err := pool.Query(ctx, `SELECT ctid FROM delayq_outbox WHERE state = 'pending' LIMIT 100`)
	if err != nil {
		t.Fatal(err)
	}
	tids, err := pgx.CollectRows(rows, pgx.RowTo[pgtype.TID])
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]string, len(tids))
	for _, tc := range []struct {
		name, sql string
		args      []any
		index     string
	}{
		{"take due", st.TakeDue, []any{hour, 1000}, "delayq_outbox_pending_run_at_idx"},
		{"take due, rescheduled rows", st.TakeDue, []any{hour, 1000}, "delayq_outbox_revoke_idx"},
		{"take due by ctid", st.TakeDue, []any{hour, 1000}, "Tid Scan"},
		{"take due of queues", st.TakeDueQueues, []any{hour, 1000, []string{"q1", "q2"}}, "delayq_outbox_pending_run_at_idx"},
		{"next due", st.NextDue, nil, "delayq_outbox_pending_run_at_idx"},
		{"queues", st.QueuedQueues, nil, "delayq_outbox_queued_idx"},
		{"depth", st.DepthLive, []any{100000}, "delayq_outbox_queued_idx"},
		{"depth of dead rows", st.DepthLive, []any{100000}, "delayq_outbox_dead_idx"},
		{"live counts, pending", st.LiveCounts, nil, "Index Only Scan using delayq_outbox_pending_run_at_idx"},
		{"live counts, queued", st.LiveCounts, nil, "Index Only Scan using delayq_outbox_queued_idx"},
		{"live counts, dead", st.LiveCounts, nil, "Index Only Scan using delayq_outbox_dead_idx"},
		{"live counts of queues, pending", st.LiveCountsSome, []any{[]string{"q1", "q2"}}, "Index Only Scan using delayq_outbox_pending_run_at_idx"},
		{"live counts of queues, queued", st.LiveCountsSome, []any{[]string{"q1", "q2"}}, "Index Only Scan using delayq_outbox_queued_idx"},
		{"live counts of queues, dead", st.LiveCountsSome, []any{[]string{"q1", "q2"}}, "Index Only Scan using delayq_outbox_dead_idx"},
		{"due by minute, pending", st.DueByMinute, []any{time.Now(), 60}, "Index Only Scan using delayq_outbox_pending_run_at_idx"},
		{"due by minute, queued", st.DueByMinute, []any{time.Now(), 60}, "delayq_outbox_queued_idx"},
		{"due by minute of queues, pending", st.DueByMinuteSome, []any{time.Now(), 60, []string{"q1", "q2"}}, "Index Only Scan using delayq_outbox_pending_run_at_idx"},
		{"due by minute of queues, queued", st.DueByMinuteSome, []any{time.Now(), 60, []string{"q1", "q2"}}, "delayq_outbox_queued_idx"},
		{"pending lag", st.PendingLag, nil, "Index Only Scan using delayq_outbox_pending_run_at_idx"},
		{"pending lag of queues", st.PendingLagSome, []any{[]string{"q1", "q2"}}, "Index Only Scan using delayq_outbox_pending_run_at_idx"},
		{"mark invalid", st.MarkInvalid, []any{tids, errs}, "Tid Scan"},
		{"prune", st.Prune, []any{(7 * 24 * time.Hour).Microseconds(), 1000}, "delayq_outbox_done_at_idx"},
		{"guard", st.Guard, []any{"q1", "t41", 1, false}, "delayq_outbox_pkey"},
		{"guard many", st.GuardMany, []any{[]string{"q1", "q2"}, []string{"t41", "t42"}, []int32{1, 1}, []bool{false, false}}, "delayq_outbox_pkey"},
		{"guard a group's runs", st.GuardGroup, []any{[]string{"q1", "q2", "q3"}, []string{"t41", "t42", "t43"}, []int32{1, 1, 1}, []bool{false, false, false}, []bool{true, false, false}}, "delayq_outbox_pkey"},
		{"enqueue: its notifier's row", st.Enqueue, []any{"q1", "new", nil, int64(0), []byte("x"), int32(1), nil, nil, int16(0), "t41", time.Now(), nil}, "Index Scan using delayq_outbox_pkey"},
		{"take a dead hook", st.TakeDeadHook, []any{[]string{"q2", "q3"}}, "delayq_outbox_hook_due_idx"},
		{"next dead hook", st.NextDeadHook, []any{[]string{"q2", "q3"}}, "delayq_outbox_hook_due_idx"},
		{"delay a dead hook", st.DelayDeadHook, []any{"q2", "t52", 1, int64(1000)}, "delayq_outbox_pkey"},
		{"retry dead", st.RetryDead, []any{[]string{"q1"}, []string{"t52"}, 1000}, "delayq_outbox_pkey"},
		{"retry dead, edited", st.RetryDeadEdited, []any{"q2", "t52", 1, []byte(`{}`)}, "delayq_outbox_pkey"},
	} {
		rows, err := pool.Query(ctx, "EXPLAIN "+tc.sql, tc.args...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		if rows.Err() != nil {
			t.Fatalf("%s: %v", tc.name, rows.Err())
		}
		p := strings.Join(plan, "\n")
		// No Seq Scan of the outbox (one of delayq_queues, a row a queue with
		// controls, is the cheap side of TakeDue's hash join).
		if !strings.Contains(p, tc.index) || strings.Contains(p, "Seq Scan on "+TableName) {
			t.Errorf("%s: plan does not use %s alone:\n%s", tc.name, tc.index, p)
		}
	}
}
