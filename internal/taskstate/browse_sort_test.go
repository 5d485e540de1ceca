package taskstate

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
)

// Each sort walks a queue's rows page by page in its order, every row once,
// whatever their states: ids ord-1, ord-2 … ord-12 are sorted by their times,
// not as text (ord-1, ord-10, ord-11, ord-2).
func TestBrowseSorts(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// ord-i: created i minutes after the start, due (12-i)/2 hours from now (ties
	// in twos, broken by id), finished i minutes ago when i is odd.
	if _, err := pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, done_at, created_at)
SELECT 'orders', 'ord-' || i, now() + ((12 - i) / 2) * interval '1 hour', '{}', 25,
       CASE WHEN i % 2 = 1 THEN 'done' ELSE 'pending' END,
       CASE WHEN i % 2 = 1 THEN now() - i * interval '1 minute' END,
       '2026-01-01'::timestamptz + i * interval '1 minute'
FROM generate_series(1, 12) AS i`); err != nil {
		t.Fatal(err)
	}
	b := NewBrowser(Config{Schema: "public", NotifyChannel: "delayq_outbox"})
	walk := func(f Filter) []string {
		var ids []string
		var cur Cursor
		for range 20 {
			rows, next, err := b.List(ctx, pool, f, cur, 5)
			if err != nil {
				t.Fatalf("%+v: %v", f, err)
			}
			for _, r := range rows {
				ids = append(ids, r.ID)
			}
			if next == (Cursor{}) {
				return ids
			}
			cur = next
		}
		t.Fatalf("%+v: no end", f)
		return nil
	}
	for _, tc := range []struct {
		f    Filter
		want []string
	}{
		{Filter{Queue: "orders", Sort: SortID}, []string{"ord-1", "ord-10", "ord-11", "ord-12", "ord-2", "ord-3", "ord-4", "ord-5", "ord-6", "ord-7", "ord-8", "ord-9"}},
		{Filter{Queue: "orders", Sort: SortCreated}, []string{"ord-12", "ord-11", "ord-10", "ord-9", "ord-8", "ord-7", "ord-6", "ord-5", "ord-4", "ord-3", "ord-2", "ord-1"}},
		{Filter{Queue: "orders", Sort: SortDue}, []string{"ord-11", "ord-12", "ord-10", "ord-9", "ord-7", "ord-8", "ord-5", "ord-6", "ord-3", "ord-4", "ord-1", "ord-2"}},
		{Filter{Queue: "orders", Sort: SortDue, State: Pending}, []string{"ord-12", "ord-10", "ord-8", "ord-6", "ord-4", "ord-2"}},
		{Filter{Queue: "orders", Sort: SortFinished}, []string{"ord-1", "ord-3", "ord-5", "ord-7", "ord-9", "ord-11"}},
		{Filter{Queue: "orders", Sort: SortFinished, State: Done}, []string{"ord-1", "ord-3", "ord-5", "ord-7", "ord-9", "ord-11"}},
		{Filter{Queue: "orders", Sort: SortCreated, State: Done}, []string{"ord-11", "ord-9", "ord-7", "ord-5", "ord-3", "ord-1"}},
	} {
		if got := walk(tc.f); !slices.Equal(got, tc.want) {
			t.Errorf("%+v:\n got %q\nwant %q", tc.f, got, tc.want)
		}
	}
	for _, f := range []Filter{{Sort: SortCreated}, {Queue: "orders", Sort: "size"}, {Queue: "orders", Prefix: "ord-1", Sort: SortDue}} {
		if _, _, err := b.List(ctx, pool, f, Cursor{}, 5); err == nil {
			t.Errorf("%+v: no error", f)
		}
	}
}

// A search reads at most its scan of rows a step, and goes on from where the
// step stopped, to the queue's last row; it returns the rows whose payload holds
// the needle, of the state asked for.
func TestBrowseSearchSteps(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, done_at)
SELECT 'orders', 'o' || lpad(i::text, 2, '0'), now(), convert_to(format('{"customer":{"id":%s}}', i % 4), 'UTF8'), 25,
       CASE WHEN i % 8 = 0 THEN 'dead' ELSE 'pending' END, CASE WHEN i % 8 = 0 THEN now() END
FROM generate_series(1, 10) AS i
UNION ALL SELECT 'other', 'x', now(), '{"customer":{"id":0}}', 25, 'pending', NULL`); err != nil {
		t.Fatal(err)
	}
	b := NewBrowser(Config{Schema: "public", NotifyChannel: "delayq_outbox"})
	var got []string
	var scanned []int
	after := ""
	for range 10 {
		st, err := b.Search(ctx, pool, "orders", "", []byte(`"id":0`), after, 3, 10)
		if err != nil {
			t.Fatal(err)
		}
		scanned = append(scanned, st.Scanned)
		for _, r := range st.Rows {
			got = append(got, r.ID+":"+string(r.Payload))
		}
		if st.Complete {
			break
		}
		after = st.Last
	}
	if want := []string{`o04:{"customer":{"id":0}}`, `o08:{"customer":{"id":0}}`}; !slices.Equal(got, want) {
		t.Errorf("found %q, want %q", got, want)
	}
	if !slices.Equal(scanned, []int{3, 3, 3, 1}) {
		t.Errorf("scanned %v a step, want 3, 3, 3, 1", scanned)
	}
	st, err := b.Search(ctx, pool, "orders", Dead, []byte(`"id":0`), "", 100, 5)
	if err != nil || len(st.Rows) != 1 || st.Rows[0].ID != "o08" || !st.Complete {
		t.Errorf("dead only: %+v %v", st, err)
	}
	st, err = b.Search(ctx, pool, "orders", "", []byte(`"id":`), "", 100, 2)
	if err != nil || len(st.Rows) != 2 || st.Last != "o02" || st.Complete {
		t.Errorf("stopped by its hits: %+v %v", st, err)
	}
}

// The sorts walk an index where one serves: finish time of every state on
// done_at's; the queued and dead rows of a queue, sorted by another column, on
// their partial indexes (a few rows each), never the table.
func TestBrowseSortsUseIndexes(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	fillBrowse(t, pool, 20000)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := NewBrowse(Config{Schema: "public", NotifyChannel: "delayq_outbox"})
	for _, tc := range []struct {
		name, sql string
		args      []any
		index     string
	}{
		{"finished, every state", b.Finished, []any{"q3", "", nil, "", "", nil, nil, 50}, "delayq_outbox_done_at_idx"},
		{"queued by due", b.ByDue, []any{"q1", "queued", nil, "", nil, nil, 50}, "delayq_outbox_queued_idx|delayq_outbox_pkey"},
		{"dead by created", b.ByCreated, []any{"q2", "dead", nil, "", nil, nil, 50}, "delayq_outbox_dead_idx|delayq_outbox_pkey"},
	} {
		p := explain(t, ctx, pool, tc.sql, tc.args...)
		uses := false
		for _, index := range strings.Split(tc.index, "|") {
			uses = uses || strings.Contains(p, index)
		}
		if !uses || strings.Contains(p, "Seq Scan") {
			t.Errorf("%s: plan does not use %s:\n%s", tc.name, tc.index, p)
		}
	}
}
