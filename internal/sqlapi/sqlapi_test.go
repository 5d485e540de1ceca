package sqlapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/internal/sqlapi"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/workflow"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// sides are the two enqueues of one test, each on a database of its own: the Go
// client on goDB, the SQL functions on one connection of sqlDB (a session: the
// functions' cooldown memory is the session's, as the Go client's is its own).
type sides struct {
	ctx   context.Context
	ob    *outbox.Client
	api   sqlapi.Client
	goDB  *pgxpool.Pool
	sqlDB *pgxpool.Pool
	conn  *pgxpool.Conn
}

func newSides(t *testing.T, cfg outbox.Config) *sides {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	ob, err := outbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &sides{ctx: ctx, ob: ob, api: sqlapi.New(""), goDB: testenv.Postgres(t), sqlDB: testenv.Postgres(t)}
	if s.conn, err = s.sqlDB.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.conn.Release)
	return s
}

// stored is one row as both sides compare it: every column, the two the clock
// sets apart.
type stored struct {
	cols      map[string]any // every column but created_at and run_at, as to_jsonb gives them
	createdAt time.Time
	runAt     time.Time
}

func readRow(t *testing.T, ctx context.Context, q outbox.Querier, queue, id string) (stored, bool) {
	t.Helper()
	var (
		raw []byte
		r   stored
	)
	err := q.QueryRow(ctx, `SELECT to_jsonb(t) - 'created_at' - 'run_at', created_at, run_at
		FROM delayq_outbox t WHERE queue = $1 AND task_id = $2`, queue, id).Scan(&raw, &r.createdAt, &r.runAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return stored{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &r.cols); err != nil {
		t.Fatal(err)
	}
	return r, true
}

func dbNow(t *testing.T, ctx context.Context, q outbox.Querier) time.Time {
	t.Helper()
	var now time.Time
	if err := q.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// window is the database clock around a call.
type window struct{ from, to time.Time }

func (w window) holds(at time.Time) bool { return !at.Before(w.from) && !at.After(w.to) }

// compare checks that the row written by each side for task is the same: every
// column equal, created_at within the call's window, run_at equal to the task's
// RunAt or, with a delay, its window plus the delay.
func compare(t *testing.T, name string, task outbox.Task, goRow, sqlRow stored, goWin, sqlWin window) {
	t.Helper()
	if !reflect.DeepEqual(goRow.cols, sqlRow.cols) {
		t.Errorf("%s: the rows differ:\n go:  %v\n sql: %v", name, goRow.cols, sqlRow.cols)
	}
	for _, c := range []struct {
		side string
		row  stored
		win  window
	}{{"go", goRow, goWin}, {"sql", sqlRow, sqlWin}} {
		if !c.win.holds(c.row.createdAt) {
			t.Errorf("%s, %s: created_at %v outside the call's window %v..%v", name, c.side, c.row.createdAt, c.win.from, c.win.to)
		}
		switch {
		case !task.RunAt.IsZero():
			if !c.row.runAt.Equal(task.RunAt.Truncate(time.Microsecond)) {
				t.Errorf("%s, %s: run_at %v, want %v", name, c.side, c.row.runAt, task.RunAt)
			}
		default:
			base := c.row.runAt.Add(-task.Delay.Truncate(time.Microsecond))
			if !c.win.holds(base) {
				t.Errorf("%s, %s: run_at %v minus the delay is outside the call's window %v..%v", name, c.side, c.row.runAt, c.win.from, c.win.to)
			}
		}
	}
}

// TestSameRows: for the same task, Enqueue and delayq_enqueue write the same row,
// every column, and report the same result; over each option, a duplicate, and the
// cooldown's notify_late (a sequence of near-due enqueues into one queue).
func TestSameRows(t *testing.T) {
	t.Parallel()
	// A cooldown far longer than the test: whether an enqueue leans on the one
	// before does not depend on the machine's speed.
	s := newSides(t, outbox.Config{NotifyCooldown: 10 * time.Minute})
	if _, err := s.conn.Exec(s.ctx, `SET delayq.notify_cooldown_ms = 600000`); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(48 * time.Hour).Round(time.Second).Add(1234567 * time.Nanosecond)
	cases := []struct {
		name string
		task outbox.Task
	}{
		{"queue and id", outbox.Task{Queue: "q", ID: "a"}},
		{"near-due after a notifier", outbox.Task{Queue: "q", ID: "b", Payload: []byte("x")}},
		{"payload", outbox.Task{Queue: "q", ID: "c", Payload: []byte(`{"order":"1001"}`), Delay: time.Hour}},
		{"empty payload", outbox.Task{Queue: "q", ID: "d", Payload: []byte{}}},
		{"delay of a minute", outbox.Task{Queue: "q2", ID: "e", Delay: time.Minute}},
		{"delay under a microsecond", outbox.Task{Queue: "q2", ID: "f", Delay: 1500 * time.Nanosecond}},
		{"delay beyond notify within", outbox.Task{Queue: "q3", ID: "g", Delay: 31 * time.Second}},
		{"run at in the future", outbox.Task{Queue: "q3", ID: "h", RunAt: future}},
		{"run at in the past", outbox.Task{Queue: "q3", ID: "i", RunAt: time.Date(2001, 2, 3, 4, 5, 6, 7000, time.UTC)}},
		{"max attempts", outbox.Task{Queue: "q", ID: "j", MaxAttempts: 7}},
		{"max attempts at the limit", outbox.Task{Queue: "q", ID: "k", MaxAttempts: validate.MaxAttempts}},
		{"priority", outbox.Task{Queue: "q", ID: "l", Priority: 9}},
		{"start by with run at", outbox.Task{Queue: "q4", ID: "m", RunAt: future, StartBy: future.Add(time.Minute)}},
		{"start by at run at", outbox.Task{Queue: "q4", ID: "n", RunAt: future, StartBy: future}},
		{"start by with a delay", outbox.Task{Queue: "q4", ID: "o", Delay: time.Hour, StartBy: time.Now().Add(2 * time.Hour)}},
		{"trace context", outbox.Task{Queue: "q", ID: "p", TraceContext: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 k=v"}},
		{"concurrency key", outbox.Task{Queue: "q", ID: "ck", ConcurrencyKey: "tenant-7"}},
		{"concurrency key of 200 bytes, not ASCII", outbox.Task{Queue: "q", ID: "ck2", ConcurrencyKey: strings.Repeat("é", 100)}},
		{"every option", outbox.Task{Queue: "q5", ID: "all~|!z", Payload: []byte{0, 1, 2, 255}, Delay: 90 * time.Second,
			MaxAttempts: 3, Priority: 4, StartBy: time.Now().Add(time.Hour), TraceContext: "t", ConcurrencyKey: "acct 1"}},
		{"duplicate", outbox.Task{Queue: "q", ID: "a", Payload: []byte("other"), Delay: time.Hour}},
		{"duplicate past its start deadline", outbox.Task{Queue: "q4", ID: "m", StartBy: time.Now().Add(-time.Hour).Add(time.Millisecond)}},
		{"a queue of 64 bytes, an id of 200", outbox.Task{Queue: strings.Repeat("Q", 64), ID: strings.Repeat("i", 200)}},
	}
	for _, c := range cases {
		before := dbNow(t, s.ctx, s.goDB)
		goRes, err := s.ob.Enqueue(s.ctx, s.goDB, c.task)
		if err != nil {
			t.Fatalf("%s: go: %v", c.name, err)
		}
		goWin := window{before, dbNow(t, s.ctx, s.goDB)}
		before = dbNow(t, s.ctx, s.conn)
		sqlRes, err := s.api.Enqueue(s.ctx, s.conn, c.task)
		if err != nil {
			t.Fatalf("%s: sql: %v", c.name, err)
		}
		sqlWin := window{before, dbNow(t, s.ctx, s.conn)}
		if goRes.Duplicate != sqlRes.Duplicate {
			t.Errorf("%s: duplicate: go %v, sql %v", c.name, goRes.Duplicate, sqlRes.Duplicate)
		}
		goRow, ok1 := readRow(t, s.ctx, s.goDB, c.task.Queue, c.task.ID)
		sqlRow, ok2 := readRow(t, s.ctx, s.conn, c.task.Queue, c.task.ID)
		if !ok1 || !ok2 {
			t.Fatalf("%s: rows found: go %v, sql %v", c.name, ok1, ok2)
		}
		if goRes.Duplicate {
			if !sqlRes.RunAt.IsZero() {
				t.Errorf("%s: sql: a duplicate's due_at %v, want NULL", c.name, sqlRes.RunAt)
			}
			if !reflect.DeepEqual(goRow.cols, sqlRow.cols) {
				t.Errorf("%s: the rows differ:\n go:  %v\n sql: %v", c.name, goRow.cols, sqlRow.cols)
			}
			continue
		}
		compare(t, c.name, c.task, goRow, sqlRow, goWin, sqlWin)
		if !goRes.RunAt.Equal(goRow.runAt) || !sqlRes.RunAt.Equal(sqlRow.runAt) {
			t.Errorf("%s: results' run at: go %v (row %v), sql %v (row %v)", c.name, goRes.RunAt, goRow.runAt, sqlRes.RunAt, sqlRow.runAt)
		}
	}
	// The sequence above left notify_late set on the near-due rows that leaned on
	// a notifier, in both: check the test saw both kinds.
	var marked, unmarked int
	if err := s.conn.QueryRow(s.ctx, `SELECT count(*) FILTER (WHERE notify_late IS NOT NULL), count(*) FILTER (WHERE notify_late IS NULL)
		FROM delayq_outbox`).Scan(&marked, &unmarked); err != nil {
		t.Fatal(err)
	}
	if marked == 0 || unmarked == 0 {
		t.Errorf("%d rows with notify_late, %d without: want both", marked, unmarked)
	}
}

// TestSameRowsMany: EnqueueMany and delayq_enqueue_many write the same rows and
// report the same results, duplicates in the batch and of existing rows included.
func TestSameRowsMany(t *testing.T) {
	t.Parallel()
	s := newSides(t, outbox.Config{})
	future := time.Now().Add(24 * time.Hour).Round(time.Millisecond).Add(3 * time.Microsecond)
	first := []outbox.Task{{Queue: "m", ID: "exists", Payload: []byte("1")}}
	batch := []outbox.Task{
		{Queue: "m", ID: "z", Payload: []byte("z"), Delay: time.Minute},
		{Queue: "m", ID: "exists", Payload: []byte("2")},
		{Queue: "a", ID: "b", RunAt: future, StartBy: future.Add(time.Hour), Priority: 2, MaxAttempts: 4, TraceContext: "tc"},
		{Queue: "m", ID: "z", Payload: []byte("second z")},
		{Queue: "m", ID: "Z"},
		{Queue: "m", ID: "y", Delay: time.Hour, Priority: 9, ConcurrencyKey: "k1"},
		{Queue: "m", ID: "x", ConcurrencyKey: "k2"},
	}
	fresh := []outbox.Task{ // every one inserted: the functions' path without a join
		{Queue: "n", ID: "3", Delay: 2 * time.Hour},
		{Queue: "n", ID: "1", RunAt: future, Priority: 1},
		{Queue: "b", ID: "2", Delay: time.Second, Payload: []byte("p")},
	}
	for _, b := range [][]outbox.Task{first, batch, fresh} {
		before := dbNow(t, s.ctx, s.goDB)
		goRes, err := s.ob.EnqueueMany(s.ctx, s.goDB, b)
		if err != nil {
			t.Fatal(err)
		}
		goWin := window{before, dbNow(t, s.ctx, s.goDB)}
		before = dbNow(t, s.ctx, s.conn)
		sqlRes, err := s.api.EnqueueMany(s.ctx, s.conn, b)
		if err != nil {
			t.Fatal(err)
		}
		sqlWin := window{before, dbNow(t, s.ctx, s.conn)}
		if goRes.Inserted != sqlRes.Inserted || goRes.Duplicates != sqlRes.Duplicates {
			t.Errorf("inserted and duplicates: go %d %d, sql %d %d", goRes.Inserted, goRes.Duplicates, sqlRes.Inserted, sqlRes.Duplicates)
		}
		for i, task := range b {
			g, q := goRes.Results[i], sqlRes.Results[i]
			if g.Duplicate != q.Duplicate {
				t.Errorf("task %d: duplicate: go %v, sql %v", i, g.Duplicate, q.Duplicate)
				continue
			}
			goRow, _ := readRow(t, s.ctx, s.goDB, task.Queue, task.ID)
			sqlRow, _ := readRow(t, s.ctx, s.conn, task.Queue, task.ID)
			if g.Duplicate {
				continue
			}
			compare(t, fmt.Sprintf("task %d", i), task, goRow, sqlRow, goWin, sqlWin)
			if !g.RunAt.Equal(goRow.runAt) || !q.RunAt.Equal(sqlRow.runAt) {
				t.Errorf("task %d: results' run at: go %v (row %v), sql %v (row %v)", i, g.RunAt, goRow.runAt, q.RunAt, sqlRow.runAt)
			}
		}
	}
	var n int
	if err := s.conn.QueryRow(s.ctx, `SELECT count(*) FROM delayq_outbox`).Scan(&n); err != nil || n != 9 {
		t.Errorf("%d rows (%v), want 9", n, err)
	}
}

// TestRefusedByBoth: every bad input is refused by Enqueue and delayq_enqueue, and
// by EnqueueMany and delayq_enqueue_many, with the same sentinel (the functions'
// SQLSTATE, sqlapi.Sentinel), and nothing is written.
func TestRefusedByBoth(t *testing.T) {
	t.Parallel()
	s := newSides(t, outbox.Config{})
	future := time.Now().Add(time.Hour)
	cases := []struct {
		name string
		task outbox.Task
		want error
	}{
		{"empty queue", outbox.Task{ID: "a"}, validate.ErrInvalidQueue},
		{"queue of 65 bytes", outbox.Task{Queue: strings.Repeat("q", 65), ID: "a"}, validate.ErrInvalidQueue},
		{"queue with a space", outbox.Task{Queue: "a q", ID: "a"}, validate.ErrInvalidQueue},
		{"queue with a colon", outbox.Task{Queue: "a:q", ID: "a"}, validate.ErrInvalidQueue},
		{"queue not ASCII", outbox.Task{Queue: "é", ID: "a"}, validate.ErrInvalidQueue},
		{"empty id", outbox.Task{Queue: "q"}, validate.ErrInvalidTaskID},
		{"id of 201 bytes", outbox.Task{Queue: "q", ID: strings.Repeat("i", 201)}, validate.ErrInvalidTaskID},
		{"id with a space", outbox.Task{Queue: "q", ID: "a b"}, validate.ErrInvalidTaskID},
		{"id with a brace", outbox.Task{Queue: "q", ID: "a{b"}, validate.ErrInvalidTaskID},
		{"id with a closing brace", outbox.Task{Queue: "q", ID: "a}"}, validate.ErrInvalidTaskID},
		{"id with DEL", outbox.Task{Queue: "q", ID: "a\x7f"}, validate.ErrInvalidTaskID},
		{"id not ASCII", outbox.Task{Queue: "q", ID: "é"}, validate.ErrInvalidTaskID},
		{"negative delay", outbox.Task{Queue: "q", ID: "a", Delay: -time.Microsecond}, validate.ErrInvalidDelay},
		{"delay and run at", outbox.Task{Queue: "q", ID: "a", Delay: time.Second, RunAt: future}, validate.ErrInvalidRunAt},
		{"run at the epoch", outbox.Task{Queue: "q", ID: "a", RunAt: time.Unix(0, 0)}, validate.ErrInvalidRunAt},
		{"run at before the epoch", outbox.Task{Queue: "q", ID: "a", RunAt: time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC)}, validate.ErrInvalidRunAt},
		{"run at in the year 10000", outbox.Task{Queue: "q", ID: "a", RunAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, validate.ErrInvalidRunAt},
		{"start by the epoch", outbox.Task{Queue: "q", ID: "a", StartBy: time.Unix(0, 0)}, validate.ErrInvalidStartBy},
		{"start by beyond Redis's bound", outbox.Task{Queue: "q", ID: "a", StartBy: time.UnixMilli(1e14 + 1)}, validate.ErrInvalidStartBy},
		{"start by before run at", outbox.Task{Queue: "q", ID: "a", RunAt: future, StartBy: future.Add(-time.Millisecond)}, validate.ErrInvalidStartBy},
		{"start by before now plus the delay", outbox.Task{Queue: "q", ID: "a", Delay: time.Hour, StartBy: future.Add(-time.Minute)}, validate.ErrInvalidStartBy},
		{"start by past", outbox.Task{Queue: "q", ID: "a", StartBy: time.Now().Add(-time.Minute)}, validate.ErrInvalidStartBy},
		{"payload over the default limit", outbox.Task{Queue: "q", ID: "a", Payload: make([]byte, validate.DefaultMaxPayloadBytes+1)}, outbox.ErrPayloadTooLarge},
		{"max attempts negative", outbox.Task{Queue: "q", ID: "a", MaxAttempts: -1}, validate.ErrInvalidMaxAttempts},
		{"max attempts over the limit", outbox.Task{Queue: "q", ID: "a", MaxAttempts: validate.MaxAttempts + 1}, validate.ErrInvalidMaxAttempts},
		{"max attempts beyond int32", outbox.Task{Queue: "q", ID: "a", MaxAttempts: 1 << 40}, validate.ErrInvalidMaxAttempts},
		{"trace context of 513 bytes", outbox.Task{Queue: "q", ID: "a", TraceContext: strings.Repeat("t", 513)}, validate.ErrInvalidTraceContext},
		{"trace context with a newline", outbox.Task{Queue: "q", ID: "a", TraceContext: "a\nb"}, validate.ErrInvalidTraceContext},
		{"priority negative", outbox.Task{Queue: "q", ID: "a", Priority: -1}, validate.ErrInvalidPriority},
		{"priority 10", outbox.Task{Queue: "q", ID: "a", Priority: 10}, validate.ErrInvalidPriority},
		{"concurrency key of 201 bytes", outbox.Task{Queue: "q", ID: "a", ConcurrencyKey: strings.Repeat("k", 201)}, validate.ErrInvalidConcurrencyKey},
		{"concurrency key with a newline", outbox.Task{Queue: "q", ID: "a", ConcurrencyKey: "a\nb"}, validate.ErrInvalidConcurrencyKey},
		{"concurrency key with DEL", outbox.Task{Queue: "q", ID: "a", ConcurrencyKey: "a\x7f"}, validate.ErrInvalidConcurrencyKey},
		{"concurrency key with a C1 control", outbox.Task{Queue: "q", ID: "a", ConcurrencyKey: "a\u0085"}, validate.ErrInvalidConcurrencyKey},
	}
	ok := outbox.Task{Queue: "q", ID: "fine"}
	for _, c := range cases {
		for _, p := range []struct {
			side string
			err  error
		}{
			{"go", func() error { _, err := s.ob.Enqueue(s.ctx, s.goDB, c.task); return err }()},
			{"sql", func() error { _, err := s.api.Enqueue(s.ctx, s.conn, c.task); return err }()},
			{"go many", func() error { _, err := s.ob.EnqueueMany(s.ctx, s.goDB, []outbox.Task{ok, c.task}); return err }()},
			{"sql many", func() error { _, err := s.api.EnqueueMany(s.ctx, s.conn, []outbox.Task{ok, c.task}); return err }()},
		} {
			if !errors.Is(p.err, c.want) {
				t.Errorf("%s, %s: %v, want %v", c.name, p.side, p.err, c.want)
			}
		}
	}
	for _, db := range []outbox.Querier{s.goDB, s.conn} {
		var n int
		if err := db.QueryRow(s.ctx, `SELECT count(*) FROM delayq_outbox`).Scan(&n); err != nil || n != 0 {
			t.Errorf("%d rows written (%v), want none", n, err)
		}
	}
	// The arrays of one batch have one element per task.
	_, err := s.conn.Exec(s.ctx, `SELECT * FROM delayq_enqueue_many(ARRAY['q'], ARRAY['a', 'b'])`)
	if !errors.Is(sqlapi.Err(err), validate.ErrInvalidTask) {
		t.Errorf("arrays of unequal lengths: %v, want QD016", err)
	}
}

// TestManageAgree: Cancel and delayq_cancel, Reschedule and delayq_reschedule make
// the same change and refuse the same calls with the same sentinel.
func TestManageAgree(t *testing.T) {
	t.Parallel()
	s := newSides(t, outbox.Config{})
	later := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	setup := []outbox.Task{
		{Queue: "q", ID: "live", RunAt: later},
		{Queue: "q", ID: "done", RunAt: later},
		{Queue: "q", ID: "deadline", RunAt: later, StartBy: later.Add(time.Minute)},
	}
	for _, task := range setup {
		if _, err := s.ob.Enqueue(s.ctx, s.goDB, task); err != nil {
			t.Fatal(err)
		}
		if _, err := s.api.Enqueue(s.ctx, s.conn, task); err != nil {
			t.Fatal(err)
		}
	}
	// Two tasks waiting on "live" (package workflow, on both sides): a reschedule
	// keeps one waiting, a cancel takes the other.
	wf := workflow.New(s.ob)
	for _, id := range []string{"waiting", "waiting-2"} {
		for _, q := range []outbox.Querier{s.goDB, s.conn} {
			if _, err := wf.Enqueue(s.ctx, q, outbox.Task{Queue: "q", ID: id, RunAt: later}, workflow.On("q", "live")); err != nil {
				t.Fatal(err)
			}
		}
	}
	type call struct {
		name      string
		goCall    func() error
		sqlCall   func() error
		want      error // nil: done
		queue, id string
	}
	goResched := func(id string, at time.Time) func() error {
		return func() error { return s.ob.Reschedule(s.ctx, s.goDB, "q", id, at) }
	}
	sqlResched := func(id string, at time.Time) func() error {
		return func() error { _, err := s.api.Reschedule(s.ctx, s.conn, "q", id, at); return err }
	}
	goCancel := func(queue, id string) func() error {
		return func() error { return s.ob.Cancel(s.ctx, s.goDB, queue, id) }
	}
	sqlCancel := func(queue, id string) func() error {
		return func() error { return s.api.Cancel(s.ctx, s.conn, queue, id) }
	}
	calls := []call{
		{"reschedule", goResched("live", later.Add(time.Hour)), sqlResched("live", later.Add(time.Hour)), nil, "q", "live"},
		{"reschedule to zero", goResched("live", time.Time{}), sqlResched("live", time.Time{}), validate.ErrInvalidRunAt, "q", "live"},
		{"reschedule to the year 10000", goResched("live", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)), sqlResched("live", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)), validate.ErrInvalidRunAt, "q", "live"},
		{"reschedule past its deadline", goResched("deadline", later.Add(2*time.Minute)), sqlResched("deadline", later.Add(2*time.Minute)), validate.ErrInvalidStartBy, "q", "deadline"},
		{"reschedule within its deadline", goResched("deadline", later.Add(time.Minute)), sqlResched("deadline", later.Add(time.Minute)), nil, "q", "deadline"},
		{"reschedule a missing task", goResched("missing", later), sqlResched("missing", later), outbox.ErrNotFound, "q", "missing"},
		{"reschedule a waiting task", goResched("waiting", later.Add(time.Hour)), sqlResched("waiting", later.Add(time.Hour)), nil, "q", "waiting"},
		{"cancel a waiting task", goCancel("q", "waiting-2"), sqlCancel("q", "waiting-2"), nil, "q", "waiting-2"},
		{"cancel", goCancel("q", "done"), sqlCancel("q", "done"), nil, "q", "done"},
		{"cancel again", goCancel("q", "done"), sqlCancel("q", "done"), outbox.ErrFinished, "q", "done"},
		{"reschedule a cancelled task", goResched("done", later), sqlResched("done", later), outbox.ErrFinished, "q", "done"},
		{"cancel a missing task", goCancel("q", "missing"), sqlCancel("q", "missing"), outbox.ErrNotFound, "q", "missing"},
		{"cancel with a bad queue", goCancel("q q", "x"), sqlCancel("q q", "x"), validate.ErrInvalidQueue, "q", "missing"},
		{"cancel with a bad id", goCancel("q", "x y"), sqlCancel("q", "x y"), validate.ErrInvalidTaskID, "q", "missing"},
	}
	for _, c := range calls {
		goErr, sqlErr := c.goCall(), c.sqlCall()
		for _, e := range []struct {
			side string
			err  error
		}{{"go", goErr}, {"sql", sqlErr}} {
			if c.want == nil && e.err != nil || c.want != nil && !errors.Is(e.err, c.want) {
				t.Errorf("%s, %s: %v, want %v", c.name, e.side, e.err, c.want)
			}
		}
		goRow, _ := readRow(t, s.ctx, s.goDB, c.queue, c.id)
		sqlRow, _ := readRow(t, s.ctx, s.conn, c.queue, c.id)
		delete(goRow.cols, "done_at")
		delete(sqlRow.cols, "done_at")
		if !reflect.DeepEqual(goRow.cols, sqlRow.cols) || !goRow.runAt.Equal(sqlRow.runAt) {
			t.Errorf("%s: the rows differ:\n go:  %v %v\n sql: %v %v", c.name, goRow.cols, goRow.runAt, sqlRow.cols, sqlRow.runAt)
		}
	}
}

// TestSettings: the delayq.* settings stand for outbox.Config's fields; a bad one
// is refused (QD030) rather than ignored.
func TestSettings(t *testing.T) {
	t.Parallel()
	s := newSides(t, outbox.Config{})
	big := outbox.Task{Queue: "q", ID: "big", Payload: make([]byte, 100<<10)}
	if _, err := s.api.Enqueue(s.ctx, s.conn, big); !errors.Is(err, outbox.ErrPayloadTooLarge) {
		t.Fatalf("100 KiB by default: %v", err)
	}
	if _, err := s.conn.Exec(s.ctx, `SET delayq.max_payload_bytes = -1; SET delayq.default_max_attempts = 3`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.api.Enqueue(s.ctx, s.conn, big); err != nil {
		t.Fatalf("100 KiB with delayq.max_payload_bytes -1: %v", err)
	}
	if r, _ := readRow(t, s.ctx, s.conn, "q", "big"); r.cols["max_attempts"] != float64(3) {
		t.Errorf("max_attempts %v, want delayq.default_max_attempts 3", r.cols["max_attempts"])
	}
	for _, bad := range []string{
		`SET delayq.max_payload_bytes = 0`, `SET delayq.max_payload_bytes = 16777217`, `SET delayq.default_max_attempts = 'x'`,
		`SET delayq.notify_within_ms = -2`, `SET delayq.notify_cooldown_ms = 0`, `SET delayq.notify_channel = 'Upper'`,
	} {
		if _, err := s.conn.Exec(s.ctx, `RESET ALL; `+bad); err != nil {
			t.Fatal(err)
		}
		_, err := s.api.Enqueue(s.ctx, s.conn, outbox.Task{Queue: "q", ID: "x"})
		if !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("%s: %v, want QD030", bad, err)
		}
	}
}

// TestNotify: the functions notify as the Go calls do: at commit, for a task due
// within NotifyWithin, never for a rollback or a task due later; within the
// session's cooldown a near-due enqueue leaves its notification out and marks its
// row (notify_late); enqueue many notifies once per queue; reschedule notifies; a
// channel set by delayq.notify_channel is the one notified.
func TestNotify(t *testing.T) {
	t.Parallel()
	s := newSides(t, outbox.Config{})
	// Migration 00015's trigger notifies at the commit of a transaction that left
	// its notification out when that commit comes 25 ms or more after its start,
	// which a loaded machine makes of any: its rule is the Go client's and is not
	// under test here (the rows' notify_late is).
	if _, err := s.sqlDB.Exec(s.ctx, `ALTER TABLE delayq_outbox DISABLE TRIGGER delayq_outbox_notify_late`); err != nil {
		t.Fatal(err)
	}
	listen, err := s.sqlDB.Acquire(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listen.Release()
	if _, err := listen.Exec(s.ctx, `LISTEN delayq_outbox; LISTEN custom`); err != nil {
		t.Fatal(err)
	}
	// next returns the next notification, as "channel/payload". A marker sent
	// after a step proves the step sent nothing: the marker comes next.
	next := func() string {
		t.Helper()
		n, err := listen.Conn().WaitForNotification(s.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n.Channel + "/" + n.Payload
	}
	marker := func() {
		t.Helper()
		if _, err := s.sqlDB.Exec(s.ctx, `SELECT pg_notify('delayq_outbox', 'marker')`); err != nil {
			t.Fatal(err)
		}
	}
	in := func(f func(tx pgx.Tx) error, commit bool) {
		t.Helper()
		tx, err := s.conn.Begin(s.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := f(tx); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit(s.ctx)
		} else {
			err = tx.Rollback(s.ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	enqueue := func(task outbox.Task) func(tx pgx.Tx) error {
		return func(tx pgx.Tx) error { _, err := s.api.Enqueue(s.ctx, tx, task); return err }
	}
	expect := func(step string, want ...string) {
		t.Helper()
		marker()
		for _, w := range append(want, "delayq_outbox/marker") {
			if got := next(); got != w {
				t.Fatalf("%s: notification %s, want %s", step, got, w)
			}
		}
	}

	in(enqueue(outbox.Task{Queue: "r", ID: "rolled-back"}), false)
	expect("a rollback")
	in(enqueue(outbox.Task{Queue: "l", ID: "later", Delay: time.Minute}), true)
	expect("a task due in a minute")
	if _, err := s.conn.Exec(s.ctx, `SET delayq.notify_cooldown_ms = 600000`); err != nil {
		t.Fatal(err)
	}
	in(enqueue(outbox.Task{Queue: "n", ID: "1"}), true)
	expect("a near-due task", "delayq_outbox/n")
	in(enqueue(outbox.Task{Queue: "n", ID: "2"}), true)
	expect("a near-due task within the cooldown")
	// Another session leans on the same notifier (the cooldown's memory is shared,
	// as the Go Client's is by its goroutines).
	other, err := s.sqlDB.Acquire(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	if _, err := other.Exec(s.ctx, `SET delayq.notify_cooldown_ms = 600000`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.api.Enqueue(s.ctx, other, outbox.Task{Queue: "n", ID: "3"}); err != nil {
		t.Fatal(err)
	}
	expect("a near-due task of another session within the cooldown")
	var late int
	if err := s.conn.QueryRow(s.ctx, `SELECT count(*) FROM delayq_outbox WHERE task_id IN ('2', '3') AND notify_late = 'delayq_outbox'`).Scan(&late); err != nil || late != 2 {
		t.Errorf("%d rows with notify_late of the enqueues that left their notification out (%v), want 2", late, err)
	}
	// A rolled-back notifier is no notifier: the next enqueue notifies.
	in(enqueue(outbox.Task{Queue: "rb", ID: "1"}), false)
	in(enqueue(outbox.Task{Queue: "rb", ID: "2"}), true)
	expect("a near-due task after a rolled-back notifier", "delayq_outbox/rb")
	in(func(tx pgx.Tx) error {
		_, err := s.api.EnqueueMany(s.ctx, tx, []outbox.Task{{Queue: "m1", ID: "a"}, {Queue: "m2", ID: "b"}, {Queue: "m1", ID: "c"}, {Queue: "m3", ID: "d", Delay: time.Hour}})
		return err
	}, true)
	marker()
	got := map[string]bool{next(): true, next(): true}
	if !got["delayq_outbox/m1"] || !got["delayq_outbox/m2"] || next() != "delayq_outbox/marker" {
		t.Errorf("enqueue many: %v, want m1 and m2, then the marker", got)
	}
	in(func(tx pgx.Tx) error {
		_, err := s.api.Reschedule(s.ctx, tx, "l", "later", time.Now().Add(time.Second))
		return err
	}, true)
	expect("a reschedule", "delayq_outbox/l")
	if _, err := s.conn.Exec(s.ctx, `RESET ALL; SET delayq.notify_channel = 'custom'`); err != nil {
		t.Fatal(err)
	}
	in(enqueue(outbox.Task{Queue: "c", ID: "1"}), true)
	expect("delayq.notify_channel", "custom/c")
}

// TestConflictAgree: Enqueue and delayq_enqueue apply the conflict policies
// alike (migration 00025): the same rows, the same results (inserted, replaced,
// debounced, duplicate), the same refusals (QD018 for a bad policy, QD023 for a
// task queued and due), and nothing written by a refusal.
func TestConflictAgree(t *testing.T) {
	t.Parallel()
	s := newSides(t, outbox.Config{})
	later := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	steps := []struct {
		name string
		task outbox.Task
		want outbox.Result // RunAt zero: not compared with a fixed time
	}{
		{"replace inserts", outbox.Task{Queue: "q", ID: "r", Payload: []byte("a"), RunAt: later, Priority: 3, Replace: true, ConcurrencyKey: "first"}, outbox.Result{RunAt: later}},
		{"replace keeps the key", outbox.Task{Queue: "q", ID: "r", Payload: []byte("b"), RunAt: later.Add(time.Minute), Replace: true, ConcurrencyKey: "second"},
			outbox.Result{Replaced: true, RunAt: later.Add(time.Minute)}},
		{"replace keeping the due time", outbox.Task{Queue: "q", ID: "r", Payload: []byte("c"), Delay: time.Hour, Replace: true, KeepRunAt: true},
			outbox.Result{Replaced: true, RunAt: later.Add(time.Minute)}},
		{"debounce inserts", outbox.Task{Queue: "q", ID: "d", Payload: []byte("1"), Debounce: 10 * time.Minute, MaxWait: time.Hour, ConcurrencyKey: "d"}, outbox.Result{}},
		{"debounce", outbox.Task{Queue: "q", ID: "d", Payload: []byte("2"), Debounce: 10 * time.Minute, MaxWait: time.Hour}, outbox.Result{Debounced: true}},
		{"debounce without a cap", outbox.Task{Queue: "q", ID: "d", Payload: []byte("3"), Debounce: time.Minute}, outbox.Result{Debounced: true}},
		{"duplicate without a policy", outbox.Task{Queue: "q", ID: "d", Payload: []byte("4")}, outbox.Result{Duplicate: true}},
	}
	for _, c := range steps {
		goRes, err := s.ob.Enqueue(s.ctx, s.goDB, c.task)
		if err != nil {
			t.Fatalf("%s: go: %v", c.name, err)
		}
		sqlRes, err := s.api.Enqueue(s.ctx, s.conn, c.task)
		if err != nil {
			t.Fatalf("%s: sql: %v", c.name, err)
		}
		for side, res := range map[string]outbox.Result{"go": goRes, "sql": sqlRes} {
			if res.Duplicate != c.want.Duplicate || res.Replaced != c.want.Replaced || res.Debounced != c.want.Debounced ||
				!c.want.RunAt.IsZero() && !res.RunAt.Equal(c.want.RunAt) {
				t.Errorf("%s, %s: %+v, want %+v", c.name, side, res, c.want)
			}
		}
		goRow, _ := readRow(t, s.ctx, s.goDB, c.task.Queue, c.task.ID)
		sqlRow, _ := readRow(t, s.ctx, s.conn, c.task.Queue, c.task.ID)
		if !reflect.DeepEqual(goRow.cols, sqlRow.cols) {
			t.Errorf("%s: the rows differ:\n go:  %v\n sql: %v", c.name, goRow.cols, sqlRow.cols)
		}
		if d := goRow.runAt.Sub(sqlRow.runAt).Abs(); d > 10*time.Second {
			t.Errorf("%s: run_at go %v, sql %v", c.name, goRow.runAt, sqlRow.runAt)
		}
	}
	// A replace keeps the row's concurrency key, as the Go client does.
	for _, db := range []outbox.Querier{s.goDB, s.conn} {
		var key string
		if err := db.QueryRow(s.ctx, `SELECT concurrency_key FROM delayq_outbox WHERE task_id = 'r'`).Scan(&key); err != nil || key != "first" {
			t.Errorf("the replaced task's key %q (%v), want the first enqueue's, \"first\"", key, err)
		}
	}
	// Queued and due (a worker may run it), and done.
	for _, db := range []outbox.Querier{s.goDB, s.conn} {
		if _, err := db.Exec(s.ctx, `UPDATE delayq_outbox SET state = 'queued', queued_at = now(), run_at = now() - interval '1 second' WHERE task_id = 'd';
			UPDATE delayq_outbox SET state = 'done', done_at = now() WHERE task_id = 'r'`); err != nil {
			t.Fatal(err)
		}
	}
	refusals := []struct {
		name string
		task outbox.Task
		want error // nil: a duplicate
	}{
		{"replace of a queued and due task", outbox.Task{Queue: "q", ID: "d", Replace: true}, outbox.ErrRunning},
		{"debounce of a queued and due task", outbox.Task{Queue: "q", ID: "d", Debounce: time.Minute}, outbox.ErrRunning},
		{"replace of a done task", outbox.Task{Queue: "q", ID: "r", Payload: []byte("z"), Replace: true}, nil},
		{"replace and debounce", outbox.Task{Queue: "q", ID: "n", Replace: true, Debounce: time.Minute}, validate.ErrInvalidConflict},
		{"debounce under a microsecond", outbox.Task{Queue: "q", ID: "n", Debounce: 500}, validate.ErrInvalidConflict},
		{"debounce negative", outbox.Task{Queue: "q", ID: "n", Debounce: -time.Second}, validate.ErrInvalidConflict},
		{"max wait without debounce", outbox.Task{Queue: "q", ID: "n", MaxWait: time.Minute}, validate.ErrInvalidConflict},
		{"max wait shorter than debounce", outbox.Task{Queue: "q", ID: "n", Debounce: time.Hour, MaxWait: time.Minute}, validate.ErrInvalidConflict},
		{"max wait negative", outbox.Task{Queue: "q", ID: "n", Debounce: time.Hour, MaxWait: -time.Minute}, validate.ErrInvalidConflict},
		{"debounce with a delay", outbox.Task{Queue: "q", ID: "n", Debounce: time.Minute, Delay: time.Second}, validate.ErrInvalidConflict},
		{"debounce with run at", outbox.Task{Queue: "q", ID: "n", Debounce: time.Minute, RunAt: later}, validate.ErrInvalidConflict},
		{"replace with a start deadline", outbox.Task{Queue: "q", ID: "n", Replace: true, StartBy: later}, validate.ErrInvalidConflict},
	}
	for _, c := range refusals {
		goRes, goErr := s.ob.Enqueue(s.ctx, s.goDB, c.task)
		sqlRes, sqlErr := s.api.Enqueue(s.ctx, s.conn, c.task)
		for side, e := range map[string]struct {
			res outbox.Result
			err error
		}{"go": {goRes, goErr}, "sql": {sqlRes, sqlErr}} {
			if c.want == nil && (e.err != nil || !e.res.Duplicate) || c.want != nil && !errors.Is(e.err, c.want) {
				t.Errorf("%s, %s: %+v, %v; want %v", c.name, side, e.res, e.err, c.want)
			}
		}
	}
	for _, db := range []outbox.Querier{s.goDB, s.conn} {
		var n, changed int
		if err := db.QueryRow(s.ctx, `SELECT count(*), count(*) FILTER (WHERE version <> 3) FROM delayq_outbox`).Scan(&n, &changed); err != nil || n != 2 || changed != 0 {
			t.Errorf("%d rows, %d not at version 3 (%v): want 2 rows, each at its third version: a refusal wrote", n, changed, err)
		}
	}
	// The function's own spellings: an unknown on_conflict, and 'duplicate'.
	_, err := s.conn.Exec(s.ctx, `SELECT * FROM delayq_enqueue('q', 'x', on_conflict => 'merge')`)
	if !errors.Is(sqlapi.Err(err), validate.ErrInvalidConflict) {
		t.Errorf("on_conflict 'merge': %v, want QD018", err)
	}
	var outcome string
	if err := s.conn.QueryRow(s.ctx, `SELECT outcome FROM delayq_enqueue('q', 'd', on_conflict => 'duplicate')`).Scan(&outcome); err != nil || outcome != "duplicate" {
		t.Errorf("on_conflict 'duplicate': %q, %v", outcome, err)
	}
}
