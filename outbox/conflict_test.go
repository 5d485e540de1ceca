package outbox_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/workflow"
)

// dbClock is the database's clock, which the statements use.
func dbClock(t *testing.T, q outbox.Querier) time.Time {
	t.Helper()
	var now time.Time
	if err := q.QueryRow(t.Context(), `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// Replace gives an existing task the new payload and the new due time (the
// last), or keeps its due time (KeepRunAt: the first), as a new version; the
// task's other fields stay.
func TestReplaceKeepsFirstOrLast(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	first := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	last := first.Add(30 * time.Minute)
	for _, keep := range []bool{false, true} {
		id := fmt.Sprintf("keep-%v", keep)
		res, err := b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "q", ID: id, Payload: []byte("a"), RunAt: first, MaxAttempts: 3, Priority: 2, Replace: true, KeepRunAt: keep})
		if err != nil || res.Duplicate || res.Replaced || !res.RunAt.Equal(first) {
			t.Fatalf("%s: first enqueue: %+v, %v", id, res, err)
		}
		res, err = b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "q", ID: id, Payload: []byte("b"), RunAt: last, MaxAttempts: 9, Replace: true, KeepRunAt: keep})
		want := last
		if keep {
			want = first
		}
		if err != nil || res.Duplicate || !res.Replaced || res.Debounced || !res.RunAt.Equal(want) {
			t.Fatalf("%s: replace: %+v, %v; want replaced, due %v", id, res, err, want)
		}
		s := load(t, b.pool, "q", id)
		if s.state != "pending" || string(s.payload) != "b" || !s.runAt.Equal(want) || s.vers != 2 || s.maxAttempts != 3 {
			t.Errorf("%s: row %+v, want pending, payload b, due %v, version 2, max attempts kept (3)", id, s, want)
		}
	}
	// Without a policy an existing key is a duplicate, as ever.
	res, err := b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "q", ID: "keep-false", Payload: []byte("c")})
	if err != nil || !res.Duplicate || res.Replaced {
		t.Fatalf("enqueue without a policy: %+v, %v; want a duplicate", res, err)
	}
	if s := load(t, b.pool, "q", "keep-false"); string(s.payload) != "b" || s.vers != 2 {
		t.Errorf("a duplicate changed the row: %+v", s)
	}
}

// Debounce pushes the due time back to the window after each enqueue, by the
// database's clock, never earlier than it was and never beyond MaxWait after
// the first enqueue (the row's created_at).
func TestDebouncePushesBackCappedByMaxWait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	task := outbox.Task{Queue: "q", ID: "d", Payload: []byte("1"), Debounce: 10 * time.Minute, MaxWait: time.Hour}
	before := dbClock(t, b.pool)
	res, err := b.client.Enqueue(ctx, b.pool, task)
	after := dbClock(t, b.pool)
	if err != nil || res.Debounced || res.Duplicate {
		t.Fatalf("first: %+v, %v", res, err)
	}
	if res.RunAt.Before(before.Add(task.Debounce)) || res.RunAt.After(after.Add(task.Debounce)) {
		t.Fatalf("first due %v, want the window after the enqueue (%v..%v)", res.RunAt, before.Add(task.Debounce), after.Add(task.Debounce))
	}
	prev := res.RunAt
	task.Payload = []byte("2")
	before = dbClock(t, b.pool)
	res, err = b.client.Enqueue(ctx, b.pool, task)
	if err != nil || !res.Debounced || res.Replaced || res.RunAt.Before(prev) || res.RunAt.Before(before.Add(task.Debounce)) {
		t.Fatalf("second: %+v, %v; want debounced to the window after %v, not before %v", res, err, before, prev)
	}
	if s := load(t, b.pool, "q", "d"); string(s.payload) != "2" || !s.runAt.Equal(res.RunAt) || s.vers != 2 {
		t.Errorf("row %+v, want the last payload and the new due time", s)
	}
	// The first enqueue 55 minutes ago: the cap is 5 minutes from now, short of
	// the window.
	if _, err := b.pool.Exec(ctx, `UPDATE delayq_outbox SET created_at = clock_timestamp() - interval '55 minutes', run_at = clock_timestamp()
		WHERE task_id = 'd'`); err != nil {
		t.Fatal(err)
	}
	var capAt time.Time
	if err := b.pool.QueryRow(ctx, `SELECT created_at + interval '1 hour' FROM delayq_outbox WHERE task_id = 'd'`).Scan(&capAt); err != nil {
		t.Fatal(err)
	}
	res, err = b.client.Enqueue(ctx, b.pool, task)
	if err != nil || !res.Debounced || !res.RunAt.Equal(capAt) {
		t.Fatalf("capped: %+v, %v; want due at the cap %v", res, err, capAt)
	}
	// A due time later than the window is never brought forward.
	later := time.Now().Add(3 * time.Hour).Truncate(time.Microsecond)
	if _, err := b.pool.Exec(ctx, `UPDATE delayq_outbox SET created_at = clock_timestamp(), run_at = $1 WHERE task_id = 'd'`, later); err != nil {
		t.Fatal(err)
	}
	if res, err = b.client.Enqueue(ctx, b.pool, task); err != nil || !res.RunAt.Equal(later) {
		t.Fatalf("a later due time: %+v, %v; want it kept, %v", res, err, later)
	}
	// Without MaxWait nothing caps it.
	free := outbox.Task{Queue: "q", ID: "free", Debounce: time.Minute}
	if _, err := b.client.Enqueue(ctx, b.pool, free); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE delayq_outbox SET created_at = clock_timestamp() - interval '1 day' WHERE task_id = 'free'`); err != nil {
		t.Fatal(err)
	}
	before = dbClock(t, b.pool)
	if res, err = b.client.Enqueue(ctx, b.pool, free); err != nil || !res.Debounced || res.RunAt.Before(before.Add(time.Minute)) {
		t.Fatalf("without MaxWait: %+v, %v; want the window after %v", res, err, before)
	}
}

// The states: a queued task not yet due is replaced as a new pending version
// that keeps queued_at (the relay replaces its copy at once); one queued and due
// is refused with ErrRunning, nothing written, the transaction usable; a
// finished one is a duplicate; a waiting one keeps waiting; a rollback writes
// nothing; a start deadline before the new due time refuses it.
func TestReplaceByState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	later := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	for _, id := range []string{"queued", "due", "done", "rolled-back"} {
		if _, err := b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "q", ID: id, Payload: []byte("old"), RunAt: later}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'queued', queued_at = now() WHERE task_id IN ('queued', 'due');
		UPDATE delayq_outbox SET run_at = clock_timestamp() - interval '1 second' WHERE task_id = 'due';
		UPDATE delayq_outbox SET state = 'done', done_at = now() WHERE task_id = 'done'`); err != nil {
		t.Fatal(err)
	}
	replace := func(id string) outbox.Task {
		return outbox.Task{Queue: "q", ID: id, Payload: []byte("new"), RunAt: later.Add(time.Minute), Replace: true}
	}

	res, err := b.client.Enqueue(ctx, b.pool, replace("queued"))
	if err != nil || !res.Replaced {
		t.Fatalf("queued, not due: %+v, %v", res, err)
	}
	if s := load(t, b.pool, "q", "queued"); s.state != "pending" || s.queuedAt == nil || s.vers != 2 || string(s.payload) != "new" {
		t.Errorf("queued, not due: row %+v, want pending version 2 with its queued_at", s)
	}

	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	before := load(t, b.pool, "q", "due")
	for _, task := range []outbox.Task{replace("due"), {Queue: "q", ID: "due", Debounce: time.Minute}} {
		res, err = b.client.Enqueue(ctx, tx, task)
		if !errors.Is(err, outbox.ErrRunning) || res != (outbox.Result{}) {
			t.Fatalf("queued and due: %+v, %v; want ErrRunning", res, err)
		}
	}
	if _, err := b.client.Enqueue(ctx, tx, outbox.Task{Queue: "q", ID: "after-refusal"}); err != nil {
		t.Fatalf("the transaction after ErrRunning: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if s := load(t, b.pool, "q", "due"); s.state != "queued" || s.vers != before.vers || string(s.payload) != "old" || !s.runAt.Equal(before.runAt) {
		t.Errorf("refused: row %+v, want it unchanged %+v", s, before)
	}

	res, err = b.client.Enqueue(ctx, b.pool, replace("done"))
	if err != nil || !res.Duplicate || res.Replaced {
		t.Fatalf("done: %+v, %v; want a duplicate", res, err)
	}
	if s := load(t, b.pool, "q", "done"); s.state != "done" || string(s.payload) != "old" || s.vers != 1 {
		t.Errorf("done: row %+v, want unchanged", s)
	}

	tx, err = b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res, err = b.client.Enqueue(ctx, tx, replace("rolled-back")); err != nil || !res.Replaced {
		t.Fatalf("in a transaction: %+v, %v", res, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if s := load(t, b.pool, "q", "rolled-back"); s.state != "pending" || string(s.payload) != "old" || s.vers != 1 || !s.runAt.Equal(later) {
		t.Errorf("rolled back: row %+v, want unchanged", s)
	}
	tx, err = b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err = b.client.Enqueue(ctx, tx, outbox.Task{Queue: "q", ID: "new-rolled-back", Replace: true}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, b.pool, `task_id = 'new-rolled-back'`); n != 0 {
		t.Errorf("a rolled-back insert with a policy left %d rows", n)
	}

	// A waiting task (workflow) takes the payload and due time, and waits still.
	wf := workflow.New(b.client)
	if _, err := wf.Enqueue(ctx, b.pool, outbox.Task{Queue: "q", ID: "waiting", Payload: []byte("old"), RunAt: later}, workflow.On("q", "queued")); err != nil {
		t.Fatal(err)
	}
	if _, err := wf.Enqueue(ctx, b.pool, replace("waiting"), workflow.On("q", "queued")); !errors.Is(err, validate.ErrInvalidConflict) {
		t.Fatalf("workflow's enqueue with a policy: %v, want ErrInvalidConflict", err)
	}
	if res, err = b.client.Enqueue(ctx, b.pool, replace("waiting")); err != nil || !res.Replaced {
		t.Fatalf("waiting: %+v, %v", res, err)
	}
	if s := load(t, b.pool, "q", "waiting"); s.state != "waiting" || string(s.payload) != "new" || !s.runAt.Equal(later.Add(time.Minute)) || s.vers != 2 {
		t.Errorf("waiting: row %+v, want waiting with the new payload and due time", s)
	}

	// A start deadline the new due time passes refuses the replace.
	if _, err := b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "q", ID: "deadline", RunAt: later, StartBy: later.Add(30 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.Enqueue(ctx, b.pool, replace("deadline")); !errors.Is(err, validate.ErrInvalidStartBy) {
		t.Fatalf("past the start deadline: %v, want ErrInvalidStartBy", err)
	}
	if s := load(t, b.pool, "q", "deadline"); s.vers != 1 || !s.runAt.Equal(later) {
		t.Errorf("past the start deadline: row %+v, want unchanged", s)
	}
}

// Many transactions debouncing one key at once: one row, every enqueue applied
// once (its version), the due time never beyond MaxWait after the first
// enqueue and never lowered (the row ends at the latest due time reported).
func TestDebounceConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	const n = 24
	task := outbox.Task{Queue: "q", ID: "hot", Debounce: time.Hour, MaxWait: time.Hour + 20*time.Millisecond}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		dues  []time.Time
		start = make(chan struct{})
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			tx, err := b.pool.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			defer tx.Rollback(ctx)
			tk := task
			tk.Payload = []byte(fmt.Sprint(i))
			res, err := b.client.Enqueue(ctx, tx, tk)
			if err == nil {
				err = tx.Commit(ctx)
			}
			if err != nil || res.Duplicate {
				t.Errorf("enqueue %d: %+v, %v", i, res, err)
				return
			}
			mu.Lock()
			dues = append(dues, res.RunAt)
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	var (
		rows    int
		version int
		runAt   time.Time
		capAt   time.Time
	)
	if err := b.pool.QueryRow(ctx, `SELECT count(*) OVER (), version, run_at, created_at + interval '1 hour 20 milliseconds'
		FROM delayq_outbox WHERE queue = 'q'`).Scan(&rows, &version, &runAt, &capAt); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || version != n {
		t.Fatalf("%d rows at version %d, want one at version %d (an insert and %d updates)", rows, version, n, n-1)
	}
	latest := slices.MaxFunc(dues, func(a, b time.Time) int { return a.Compare(b) })
	if !runAt.Equal(latest) {
		t.Errorf("row due %v, want the latest due time reported, %v: a debounce lowered it", runAt, latest)
	}
	for _, d := range dues {
		if d.After(capAt) {
			t.Errorf("due %v beyond the cap %v", d, capAt)
		}
	}
}

// The policy on database/sql, and refused by EnqueueMany.
func TestReplaceSQLAndMany(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	db := b.sqlDB(t)
	tk := outbox.Task{Queue: "q", ID: "s", Payload: []byte("a"), Delay: time.Hour, Replace: true}
	if res, err := b.client.EnqueueSQL(ctx, db, tk); err != nil || res.Replaced {
		t.Fatalf("insert: %+v, %v", res, err)
	}
	tk.Payload = []byte("b")
	if res, err := b.client.EnqueueSQL(ctx, db, tk); err != nil || !res.Replaced {
		t.Fatalf("replace: %+v, %v", res, err)
	}
	if s := load(t, b.pool, "q", "s"); string(s.payload) != "b" || s.vers != 2 {
		t.Errorf("row %+v", s)
	}
	if _, err := b.client.EnqueueMany(ctx, b.pool, []outbox.Task{{Queue: "q", ID: "m"}, tk}); !errors.Is(err, validate.ErrInvalidConflict) {
		t.Errorf("EnqueueMany with a policy: %v, want ErrInvalidConflict", err)
	}
	if n := count(t, b.pool, `task_id = 'm'`); n != 0 {
		t.Errorf("a refused batch wrote %d rows", n)
	}
}

// FuzzConflictPolicy: Validate accepts a conflict policy exactly when the
// rules hold (one of Replace and Debounce; KeepRunAt only with Replace; MaxWait
// only with Debounce and not shorter; Debounce at least 1µs and instead of a
// Delay or RunAt; no StartBy with either), and refuses the others with
// ErrInvalidConflict, an ErrInvalidTask.
func FuzzConflictPolicy(f *testing.F) {
	f.Add(false, false, int64(0), int64(0), int64(0), false, false)
	f.Add(true, true, int64(0), int64(0), int64(time.Second), false, false)
	f.Add(false, false, int64(time.Second), int64(time.Minute), int64(0), false, false)
	f.Add(true, false, int64(time.Second), int64(0), int64(0), false, false)
	f.Add(false, true, int64(0), int64(0), int64(0), true, false)
	f.Add(false, false, int64(time.Minute), int64(time.Second), int64(0), false, false)
	f.Add(false, false, int64(999), int64(0), int64(0), false, false)
	f.Add(false, false, int64(0), int64(time.Minute), int64(0), false, false)
	f.Add(true, false, int64(0), int64(0), int64(0), false, true)
	f.Add(false, false, int64(time.Second), int64(-1), int64(0), true, false)
	c, err := outbox.New(outbox.Config{})
	if err != nil {
		f.Fatal(err)
	}
	runAt := time.Now().Add(time.Hour)
	f.Fuzz(func(t *testing.T, replace, keep bool, debounce, maxWait, delay int64, withRunAt, withStartBy bool) {
		task := outbox.Task{Queue: "q", ID: "id", Replace: replace, KeepRunAt: keep,
			Debounce: time.Duration(debounce), MaxWait: time.Duration(maxWait), Delay: time.Duration(max(delay, 0))}
		if withRunAt {
			task.Delay, task.RunAt = 0, runAt
		}
		if withStartBy {
			task.StartBy = runAt.Add(time.Hour)
		}
		d, w := task.Debounce, task.MaxWait
		valid := (!keep || replace) && !(replace && d != 0) &&
			(d == 0 || d >= time.Microsecond && task.Delay == 0 && task.RunAt.IsZero()) &&
			(w == 0 || w > 0 && d > 0 && w >= d) &&
			(!withStartBy || !replace && d == 0)
		err := c.Validate(task)
		switch {
		case valid && err != nil:
			t.Fatalf("%+v refused: %v", task, err)
		case !valid && (!errors.Is(err, validate.ErrInvalidConflict) || !errors.Is(err, outbox.ErrInvalidTask)):
			t.Fatalf("%+v: %v, want ErrInvalidConflict", task, err)
		}
	})
}
