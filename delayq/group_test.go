package delayq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/outbox"
)

// groupOf returns a queue configuration whose first claim of n due tasks makes
// one group of them: one group loop (Concurrency = MaxTasks = n) and a MaxWait
// far longer than n round trips. (Retries of fewer tasks wait for it.)
func groupOf(n int) QueueConfig {
	return QueueConfig{
		Concurrency: n, GroupCommit: GroupCommit{MaxTasks: n, MaxWait: time.Second},
		Backoff: Backoff{Base: time.Millisecond, Max: time.Millisecond},
	}
}

// insertTxEffect writes the effect with the id of the transaction it commits in.
func insertTxEffect(ctx context.Context, tx pgx.Tx, t *Task) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (task_id, attempt, worker) VALUES ($1, $2, txid_current()::text)`, t.ID, t.Attempt)
	return err
}

// Many tasks through group commit, several groups at once: every task done once,
// its effect committed in a transaction shared with others, never more than
// MaxTasks to a transaction, Redis empty.
func TestGroupCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n, maxTasks = 500, 16
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		if err := w.HandleTx("g", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			return insertTxEffect(ctx, tx, tk)
		}, QueueConfig{Concurrency: 48, GroupCommit: GroupCommit{MaxTasks: maxTasks, MaxWait: 100 * time.Millisecond}}); err != nil {
			t.Fatal(err)
		}
	})
	tasks := make([]outbox.Task, n)
	for i, id := range ids("t", n) {
		tasks[i] = task("g", id)
	}
	b.enqueue(t, tasks...)
	for range n {
		if f := h.next(t); f.out != outSucceeded {
			t.Fatalf("%s: %s; log:\n%s", f.task.ID, f.out, h.logs)
		}
	}
	if got := b.count(t, `SELECT count(DISTINCT task_id) FROM effects`); got != n {
		t.Errorf("%d tasks with effects, want %d", got, n)
	}
	if got := b.count(t, `SELECT count(*) FROM effects`); got != n {
		t.Errorf("%d effects, want %d", got, n)
	}
	if got := b.count(t, `SELECT count(*) FROM delayq_outbox WHERE state = 'done'`); got != n {
		t.Errorf("%d rows done, want %d", got, n)
	}
	groups := b.count(t, `SELECT count(DISTINCT worker) FROM effects`)
	largest := b.count(t, `SELECT max(c) FROM (SELECT count(*) AS c FROM effects GROUP BY worker) g`)
	t.Logf("%d tasks in %d transactions, at most %d in one", n, groups, largest)
	if groups >= n/2 || largest > maxTasks {
		t.Errorf("%d tasks in %d transactions, at most %d in one: want fewer than %d, at most %d", n, groups, largest, n/2, maxTasks)
	}
	st, err := b.dq.Stats(context.Background(), "g")
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 0 || st.Active != 0 {
		t.Errorf("Redis still holds tasks: %+v", st)
	}
	if s := h.w.Stats(); s.Succeeded != n || s.Failed != 0 || s.Suppressed != 0 {
		t.Errorf("stats %+v", s)
	}
}

// In the middle of one group: a handler that fails, a handler that swallowed a
// statement's error, a task cancelled before its guard (the guard refuses), a
// handler that panics. Each of them rolls back to its own savepoint; the others
// commit together, in one transaction.
func TestGroupCommitFailuresInTheMiddle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	ids := []string{"a", "fails", "b", "swallowed", "c", "cancelled", "d", "panics", "e"}
	var tasks []outbox.Task
	for _, id := range ids {
		tasks = append(tasks, task("m", id))
	}
	b.enqueue(t, tasks...)
	if err := b.ob.Cancel(ctx, b.pool, "m", "cancelled"); err != nil {
		t.Fatal(err)
	}
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.HandleTx("m", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if err := insertTxEffect(ctx, tx, tk); err != nil {
				return err
			}
			if tk.Attempt > 1 {
				return nil
			}
			switch tk.ID {
			case "fails":
				return errors.New("injected")
			case "swallowed":
				_, _ = tx.Exec(ctx, `SELECT 1 / 0`)
			case "panics":
				panic("injected")
			}
			return nil
		}, groupOf(len(ids)))
	})
	got := map[string][]outcome{}
	for range len(ids) + 3 { // three retries
		f := h.next(t)
		got[f.task.ID] = append(got[f.task.ID], f.out)
	}
	for _, id := range ids {
		want := []outcome{outSucceeded}
		switch id {
		case "fails", "swallowed", "panics":
			want = []outcome{outRetried, outSucceeded}
		case "cancelled":
			want = []outcome{outSuppressed}
		}
		if fmt.Sprint(got[id]) != fmt.Sprint(want) {
			t.Errorf("%s: outcomes %v, want %v; log:\n%s", id, got[id], want, h.logs)
		}
		n := b.count(t, `SELECT count(*) FROM effects WHERE task_id = $1`, id)
		switch r := b.row(t, "m", id); {
		case id == "cancelled":
			if r.state != "cancelled" || n != 0 {
				t.Errorf("cancelled: row %+v, %d effects", r, n)
			}
		case n != 1 || r.state != "done":
			t.Errorf("%s: row %+v, %d effects, want done with 1", id, r, n)
		}
	}
	// The first runs that succeeded committed in one transaction.
	if n := b.count(t, `SELECT count(DISTINCT worker) FROM effects WHERE attempt = 1`); n != 1 {
		t.Errorf("first runs committed in %d transactions, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM effects WHERE attempt = 1`); n != 5 {
		t.Errorf("%d first runs committed, want 5", n)
	}
}

// One task of a group loses its lease while its handler runs: its handler's
// context is cancelled, its part rolls back, and the others commit.
func TestGroupCommitLeaseLostInTheMiddle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := []string{"a", "b", "lost", "c", "d"}
	var tasks []outbox.Task
	for _, id := range ids {
		tasks = append(tasks, task("l", id))
	}
	b.enqueue(t, tasks...)
	k, err := b.dq.Keys("l")
	if err != nil {
		t.Fatal(err)
	}
	h := b.start(t, WorkerConfig{Lease: 2 * time.Second, HeartbeatInterval: 20 * time.Millisecond}, func(w *worker) {
		_ = w.HandleTx("l", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if err := insertTxEffect(ctx, tx, tk); err != nil {
				return err
			}
			if tk.ID != "lost" {
				return nil
			}
			// As a takeover would: the token is someone else's.
			if err := b.rdb.HSet(ctx, k.TaskKey("lost"), "t", "someone-else").Err(); err != nil {
				return err
			}
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), ErrLeaseLost) {
				t.Errorf("cause %v, want ErrLeaseLost", context.Cause(ctx))
			}
			return ctx.Err()
		}, groupOf(len(ids)))
	})
	got := map[string]outcome{}
	for range ids {
		f := h.next(t)
		got[f.task.ID] = f.out
	}
	for _, id := range ids {
		want, state, effects := outSucceeded, "done", 1
		if id == "lost" {
			want, state, effects = outLeaseLost, "queued", 0
		}
		if got[id] != want {
			t.Errorf("%s: %s, want %s", id, got[id], want)
		}
		if r := b.row(t, "l", id); r.state != state {
			t.Errorf("%s: state %s, want %s", id, r.state, state)
		}
		if n := b.count(t, `SELECT count(*) FROM effects WHERE task_id = $1`, id); n != effects {
			t.Errorf("%s: %d effects, want %d", id, n, effects)
		}
	}
	if n := b.count(t, `SELECT count(DISTINCT worker) FROM effects`); n != 1 {
		t.Errorf("committed in %d transactions, want 1", n)
	}
}

// A group whose COMMIT fails (a deferred constraint, violated by one handler):
// nothing of it is kept, every run of it is retried, and each task ends done
// with one effect.
func TestGroupCommitFailedCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(context.Background(), `CREATE TABLE once (id text,
		CONSTRAINT once_id UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	ids := []string{"a", "b", "deferred", "c"}
	var tasks []outbox.Task
	for _, id := range ids {
		tasks = append(tasks, task("f", id))
	}
	b.enqueue(t, tasks...)
	var failed atomic.Bool
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.HandleTx("f", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if err := insertTxEffect(ctx, tx, tk); err != nil {
				return err
			}
			if tk.ID == "deferred" && failed.CompareAndSwap(false, true) {
				_, err := tx.Exec(ctx, `INSERT INTO once VALUES ('x'), ('x')`) // fails at COMMIT only
				return err
			}
			return nil
		}, groupOf(len(ids)))
	})
	got := map[string][]outcome{}
	for range 2 * len(ids) {
		f := h.next(t)
		got[f.task.ID] = append(got[f.task.ID], f.out)
	}
	for _, id := range ids {
		if want := []outcome{outRetried, outSucceeded}; fmt.Sprint(got[id]) != fmt.Sprint(want) {
			t.Errorf("%s: outcomes %v, want %v; log:\n%s", id, got[id], want, h.logs)
		}
		if r := b.row(t, "f", id); r.state != "done" || r.attempt != 1 || r.lastError == "" {
			t.Errorf("%s: row %+v, want done after one recorded failure", id, r)
		}
		if n := b.count(t, `SELECT count(*) FROM effects WHERE task_id = $1`, id); n != 1 {
			t.Errorf("%s: %d effects, want 1", id, n)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM once`); n != 0 {
		t.Errorf("%d rows of the failed commit kept", n)
	}
}

// At a shutdown, runs waiting for a group that its timeout stopped are given back
// without running; the run in progress is cancelled and given back too.
func TestGroupCommitShutdown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, task("s", "a"), task("s", "b"), task("s", "c"))
	entered := make(chan string, 3)
	h := b.start(t, WorkerConfig{ShutdownTimeout: -1}, func(w *worker) {
		_ = w.HandleTx("s", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if err := insertTxEffect(ctx, tx, tk); err != nil {
				return err
			}
			entered <- tk.ID
			<-ctx.Done()
			return ctx.Err()
		}, groupOf(3))
	})
	first := <-entered
	h.stop()
	for range 3 {
		if f := h.next(t); f.out != outReleased {
			t.Errorf("%s: %s, want released", f.task.ID, f.out)
		}
	}
	if len(entered) != 0 {
		t.Errorf("a handler ran after %s's was cancelled by the shutdown", first)
	}
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 0 {
		t.Errorf("%d effects committed", n)
	}
	st, err := b.dq.Stats(context.Background(), "s")
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 3 {
		t.Errorf("Redis %+v, want the 3 tasks ready again", st)
	}
}

// A group sends nothing for a run whose handler writes nothing, and a writing
// run's first statement carries its savepoint (and the group's BEGIN, for the
// first): the guards of the whole group go in one statement with the COMMIT.
// Each case runs one group and checks the messages it sent, as TestHandlerTx
// does for a transaction of its own; both with prepared statements and with the
// simple protocol.
func TestGroupCommitRoundTrips(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cache_statement", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testGroupCommitRoundTrips(t, mode)
		})
	}
}

func testGroupCommitRoundTrips(t *testing.T, execMode string) {
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	pool, log := tracedPool(t, withParam(t, b.url, "default_query_exec_mode", execMode))
	const n = 4
	write := func(ctx context.Context, tx pgx.Tx, tk *Task) error { return insertTxEffect(ctx, tx, tk) }
	cases := []struct {
		name    string
		writes  func(i int) bool // which runs of the group write
		trips   []string
		effects int
	}{{
		name:   "no-op runs",
		writes: func(int) bool { return false },
		trips:  []string{"WITH"},
	}, {
		name:    "writing runs",
		writes:  func(int) bool { return true },
		trips:   []string{"BEGIN SAVEPOINT INSERT", "SAVEPOINT INSERT", "SAVEPOINT INSERT", "SAVEPOINT INSERT", "WITH COMMIT"},
		effects: n,
	}, {
		name:    "no-op runs around a writing one",
		writes:  func(i int) bool { return i == 2 },
		trips:   []string{"BEGIN SAVEPOINT INSERT", "WITH COMMIT"},
		effects: 1,
	}}
	for _, c := range cases {
		q := queueName(c.name)
		var tasks []outbox.Task
		for i := range n {
			tasks = append(tasks, task(q, fmt.Sprint(i)))
		}
		h := b.startOn(t, pool, WorkerConfig{}, func(w *worker) {
			if err := w.HandleTx(q, func(ctx context.Context, tx pgx.Tx, tk *Task) error {
				var i int
				if _, err := fmt.Sscan(tk.ID, &i); err != nil {
					return err
				}
				if c.writes(i) {
					return write(ctx, tx, tk)
				}
				return nil
			}, groupOf(n)); err != nil {
				t.Fatal(err)
			}
		})
		log.take()
		b.enqueue(t, tasks...) // on b.pool, not traced: in Redis at once, one group
		for range n {
			if f := h.next(t); f.out != outSucceeded {
				t.Fatalf("%s: %s %s; log:\n%s", c.name, f.task.ID, f.out, h.logs)
			}
		}
		h.stop()
		if got := log.take(); !slices.Equal(got, c.trips) {
			t.Errorf("%s: sent %q, want %q", c.name, got, c.trips)
		}
		if got := b.count(t, `SELECT count(*) FROM delayq_outbox WHERE queue = $1 AND state = 'done'`, q); got != n {
			t.Errorf("%s: %d rows done, want %d", c.name, got, n)
		}
		if got := b.count(t, `SELECT count(*) FROM effects`); got != c.effects {
			t.Errorf("%s: %d effect rows, want %d", c.name, got, c.effects)
		}
		if _, err := b.pool.Exec(ctx, `DELETE FROM effects`); err != nil {
			t.Fatal(err)
		}
	}
}

// A refused guard among runs that wrote nothing: the cancelled task is settled by
// its row, and the others commit in the group's one statement.
func TestGroupCommitRefusedNoOp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	pool, log := tracedPool(t, b.url)
	ids := []string{"a", "b", "cancelled", "c"}
	var tasks []outbox.Task
	for _, id := range ids {
		tasks = append(tasks, task("n", id))
	}
	b.enqueue(t, tasks...)
	if err := b.ob.Cancel(ctx, b.pool, "n", "cancelled"); err != nil {
		t.Fatal(err)
	}
	log.take()
	h := b.startOn(t, pool, WorkerConfig{}, func(w *worker) {
		_ = w.HandleTx("n", func(context.Context, pgx.Tx, *Task) error { return nil }, groupOf(len(ids)))
	})
	got := map[string]outcome{}
	for range ids {
		f := h.next(t)
		got[f.task.ID] = f.out
	}
	h.stop()
	for _, id := range ids {
		want, state := outSucceeded, "done"
		if id == "cancelled" {
			want, state = outSuppressed, "cancelled"
		}
		if got[id] != want {
			t.Errorf("%s: %s, want %s; log:\n%s", id, got[id], want, h.logs)
		}
		if r := b.row(t, "n", id); r.state != state {
			t.Errorf("%s: state %s, want %s", id, r.state, state)
		}
	}
	// One statement for the group; then the refused run's row is read.
	if trips := log.take(); len(trips) == 0 || trips[0] != "WITH" || slices.Contains(trips, "BEGIN") || slices.Index(trips[1:], "WITH") >= 0 {
		t.Errorf("sent %q, want the group's guards in one statement and no transaction", trips)
	}
	if s := h.w.Stats(); s.Succeeded != 3 || s.Suppressed != 1 {
		t.Errorf("stats %+v", s)
	}
}

// The guards of runs that wrote refuse after their handlers ran: one task is
// cancelled and another completed by someone else (as a new holder of a lost
// lease would) while their handlers run. Neither's effect commits: the group is
// rolled back and run again without them, and the others commit together, each
// effect once.
func TestGroupCommitRefusedWriting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := []string{"a", "cancelled", "b", "taken", "c"}
	var tasks []outbox.Task
	for _, id := range ids {
		tasks = append(tasks, task("w", id))
	}
	b.enqueue(t, tasks...)
	var mu sync.Mutex
	calls := map[string]int{}
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.HandleTx("w", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			mu.Lock()
			calls[tk.ID]++
			mu.Unlock()
			if err := insertTxEffect(ctx, tx, tk); err != nil {
				return err
			}
			switch tk.ID { // on another connection: the group holds no lock on the rows yet
			case "cancelled":
				return b.ob.Cancel(ctx, b.pool, "w", tk.ID)
			case "taken":
				_, err := b.pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'done' WHERE queue = 'w' AND task_id = $1`, tk.ID)
				return err
			}
			return nil
		}, groupOf(len(ids)))
	})
	got := map[string]outcome{}
	for range ids {
		f := h.next(t)
		got[f.task.ID] = f.out
	}
	for _, id := range ids {
		want, state, effects := outSucceeded, "done", 1
		switch id {
		case "cancelled":
			want, state, effects = outSuppressed, "cancelled", 0
		case "taken":
			want, effects = outSuppressed, 0
		}
		if got[id] != want {
			t.Errorf("%s: %s, want %s; log:\n%s", id, got[id], want, h.logs)
		}
		if r := b.row(t, "w", id); r.state != state {
			t.Errorf("%s: state %s, want %s", id, r.state, state)
		}
		if n := b.count(t, `SELECT count(*) FROM effects WHERE task_id = $1`, id); n != effects {
			t.Errorf("%s: %d effects, want %d", id, n, effects)
		}
	}
	if n := b.count(t, `SELECT count(DISTINCT worker) FROM effects`); n != 1 {
		t.Errorf("committed in %d transactions, want 1", n)
	}
	// The refused runs ran once; the others again after the roll back (twice:
	// the first pass refused both at once).
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		want := 2
		if id == "cancelled" || id == "taken" {
			want = 1
		}
		if calls[id] != want {
			t.Errorf("%s: handler called %d times, want %d", id, calls[id], want)
		}
	}
}
