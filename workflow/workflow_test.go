package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtest"
	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
	"github.com/delayq/delayq/workflow"
)

// bundle is one test's environment: its database and Redis prefix, a client
// whose queue "q" runs handlerFor's outcome per task id ("fail-...": an error),
// and the workflow client on it.
type bundle struct {
	e  *delayqtest.Env
	c  *delayq.Client
	wf *workflow.Client
}

func setup(t *testing.T) *bundle {
	t.Helper()
	e := delayqtest.New(t, delayqtest.Options{})
	c := e.Client(t, delayq.Config{})
	h := func(_ context.Context, _ pgx.Tx, task *delayq.Task) error {
		if strings.HasPrefix(task.ID, "fail-") {
			return errors.New("planned failure")
		}
		return nil
	}
	for _, q := range []string{"q", "r"} {
		if err := c.HandleTx(q, h, delayq.QueueConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	return &bundle{e: e, c: c, wf: workflow.New(c)}
}

// enqueue commits one transaction running f.
func (b *bundle) tx(t *testing.T, f func(tx pgx.Tx) error) {
	t.Helper()
	if err := pgx.BeginFunc(context.Background(), b.e.Pool, f); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) plain(t *testing.T, ids ...string) {
	t.Helper()
	b.tx(t, func(tx pgx.Tx) error {
		for _, id := range ids {
			if _, err := b.c.Outbox().Enqueue(context.Background(), tx, outbox.Task{Queue: "q", ID: id}); err != nil {
				return err
			}
		}
		return nil
	})
}

type row struct {
	state     delayqtype.State
	waitsFor  *int
	lastError string
	hookDue   bool
	xmin      uint32
	version   int
}

func (b *bundle) row(t *testing.T, queue, id string) row {
	t.Helper()
	var r row
	err := b.e.Pool.QueryRow(context.Background(), `SELECT state, waits_for, COALESCE(last_error, ''), hook_due IS NOT NULL, xmin::text::bigint, version
		FROM delayq_outbox WHERE queue = $1 AND task_id = $2`, queue, id).Scan(&r.state, &r.waitsFor, &r.lastError, &r.hookDue, &r.xmin, &r.version)
	if err != nil {
		t.Fatalf("row %s/%s: %v", queue, id, err)
	}
	return r
}

func (b *bundle) edges(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.e.Pool.QueryRow(context.Background(), `SELECT count(*) FROM delayq_deps`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *bundle) work(t *testing.T, id string, want delayq.Outcome) {
	t.Helper()
	res := b.e.Work(context.Background(), t, b.c, "q", id)
	if res.Outcome != want {
		t.Fatalf("work %s: %v (%v), want %v", id, res.Outcome, res.Err, want)
	}
}

func (b *bundle) kill(t *testing.T, id string) {
	t.Helper()
	res := b.e.WorkLastAttempt(context.Background(), t, b.c, "q", id)
	if res.Outcome != delayq.OutcomeDead {
		t.Fatalf("work %s: %v (%v), want dead", id, res.Outcome, res.Err)
	}
}

// A task waits on two others, one enqueued earlier and one in its own
// transaction; the completion of the second releases it, in the completion's
// own transaction.
func TestReleasedByTheLastCompletion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.plain(t, "a")
	var res workflow.Result
	b.tx(t, func(tx pgx.Tx) error {
		if _, err := b.c.Outbox().Enqueue(ctx, tx, outbox.Task{Queue: "q", ID: "b"}); err != nil {
			return err
		}
		var err error
		res, err = b.wf.Enqueue(ctx, tx, outbox.Task{Queue: "r", ID: "c", Payload: []byte("x")}, workflow.On("q", "a"), workflow.On("q", "b"))
		return err
	})
	if res.Duplicate || res.State != delayqtype.StateWaiting || res.RunAt.IsZero() {
		t.Fatalf("enqueue: %+v", res)
	}
	if r := b.row(t, "r", "c"); r.state != delayqtype.StateWaiting || r.waitsFor == nil || *r.waitsFor != 2 {
		t.Fatalf("c: %+v", r)
	}
	if n := b.edges(t); n != 2 {
		t.Fatalf("%d edges, want 2", n)
	}
	b.work(t, "a", delayq.OutcomeSucceeded)
	if r := b.row(t, "r", "c"); r.state != delayqtype.StateWaiting || *r.waitsFor != 1 {
		t.Fatalf("c after a: %+v", r)
	}
	b.work(t, "b", delayq.OutcomeSucceeded)
	c, done := b.row(t, "r", "c"), b.row(t, "q", "b")
	if c.state != delayqtype.StatePending || *c.waitsFor != 0 {
		t.Fatalf("c after b: %+v", c)
	}
	if c.xmin != done.xmin {
		t.Errorf("c released by transaction %d, b completed by %d: not the same", c.xmin, done.xmin)
	}
	if n := b.edges(t); n != 0 {
		t.Errorf("%d edges left", n)
	}
	// It runs as any task now.
	res2 := b.e.Work(ctx, t, b.c, "r", "c")
	if res2.Outcome != delayq.OutcomeSucceeded {
		t.Fatalf("c: %v", res2.Outcome)
	}
}

// Dependencies finished at the enqueue count at once, each as its policy says.
func TestFinishedAtEnqueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.plain(t, "done", "fail-dead", "cancelled")
	b.work(t, "done", delayq.OutcomeSucceeded)
	b.kill(t, "fail-dead")
	if err := b.c.Outbox().Cancel(ctx, b.e.Pool, "q", "cancelled"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id      string
		deps    []workflow.Dependency
		want    delayqtype.State
		reason  string
		hookDue bool
	}{
		{"d1", []workflow.Dependency{workflow.On("q", "done")}, delayqtype.StatePending, "", false},
		{"d2", []workflow.Dependency{workflow.On("q", "done"), workflow.On("q", "fail-dead")}, delayqtype.StateDead,
			"dependency q/fail-dead dead: planned failure", true},
		{"d3", []workflow.Dependency{{Queue: "q", ID: "cancelled", OnFailure: workflow.Skip}}, delayqtype.StateCancelled,
			"dependency q/cancelled cancelled", false},
		{"d4", []workflow.Dependency{{Queue: "q", ID: "cancelled", OnFailure: workflow.Run}, {Queue: "q", ID: "fail-dead", OnFailure: workflow.Run}},
			delayqtype.StatePending, "", false},
		{"d5", []workflow.Dependency{{Queue: "q", ID: "cancelled", OnFailure: workflow.Skip}, workflow.On("q", "fail-dead")}, delayqtype.StateDead,
			"dependency q/fail-dead dead: planned failure", true},
		{"d6", nil, delayqtype.StatePending, "", false},
	} {
		var res workflow.Result
		b.tx(t, func(tx pgx.Tx) error {
			var err error
			res, err = b.wf.Enqueue(ctx, tx, outbox.Task{Queue: "r", ID: c.id}, c.deps...)
			return err
		})
		r := b.row(t, "r", c.id)
		if res.State != c.want || r.state != c.want || r.lastError != c.reason || r.hookDue != c.hookDue {
			t.Errorf("%s: result %s, row %+v; want %s %q hook %v", c.id, res.State, r, c.want, c.reason, c.hookDue)
		}
	}
	if n := b.edges(t); n != 0 {
		t.Errorf("%d edges for finished dependencies", n)
	}
}

// A dependency that dies or is cancelled while its dependents wait: each
// dependent as its policy says, in the death's transaction.
func TestPoliciesAtRuntime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.plain(t, "fail-a", "other", "c")
	b.tx(t, func(tx pgx.Tx) error {
		for _, d := range []struct {
			id string
			p  workflow.Policy
		}{{"fail", workflow.Fail}, {"skip", workflow.Skip}, {"run", workflow.Run}} {
			if _, err := b.wf.Enqueue(ctx, tx, outbox.Task{Queue: "r", ID: d.id},
				workflow.Dependency{Queue: "q", ID: "fail-a", OnFailure: d.p}, workflow.On("q", "other")); err != nil {
				return err
			}
			if _, err := b.wf.Enqueue(ctx, tx, outbox.Task{Queue: "r", ID: "c-" + d.id},
				workflow.Dependency{Queue: "q", ID: "c", OnFailure: d.p}); err != nil {
				return err
			}
		}
		return nil
	})
	b.kill(t, "fail-a")
	dead := b.row(t, "q", "fail-a")
	for id, want := range map[string]delayqtype.State{"fail": delayqtype.StateDead, "skip": delayqtype.StateCancelled, "run": delayqtype.StateWaiting} {
		r := b.row(t, "r", id)
		if r.state != want {
			t.Errorf("%s: %+v, want %s", id, r, want)
		}
		if want != delayqtype.StateWaiting && (r.xmin != dead.xmin || r.lastError != "dependency q/fail-a dead: planned failure") {
			t.Errorf("%s: %+v: not settled by the death (xmin %d) with its reason", id, r, dead.xmin)
		}
		if r.hookDue != (id == "fail") {
			t.Errorf("%s: hook due %v", id, r.hookDue)
		}
	}
	b.work(t, "other", delayq.OutcomeSucceeded)
	if r := b.row(t, "r", "run"); r.state != delayqtype.StatePending {
		t.Errorf("run after other: %+v", r)
	}
	// The producer's cancel of a dependency settles its dependents too.
	if err := b.c.Outbox().Cancel(ctx, b.e.Pool, "q", "c"); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]delayqtype.State{"c-fail": delayqtype.StateDead, "c-skip": delayqtype.StateCancelled, "c-run": delayqtype.StatePending} {
		if r := b.row(t, "r", id); r.state != want {
			t.Errorf("%s: %+v, want %s", id, r, want)
		}
	}
	// Those who died by policy are handed to the OnDead hook like any death.
	if n := b.edges(t); n != 0 {
		t.Errorf("%d edges left", n)
	}
}

// A chain runs link by link; a death stops the rest in one transaction.
func TestChain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var res []workflow.Result
	b.tx(t, func(tx pgx.Tx) error {
		var err error
		res, err = b.wf.Chain(ctx, tx, workflow.Fail,
			outbox.Task{Queue: "q", ID: "1"}, outbox.Task{Queue: "q", ID: "2"}, outbox.Task{Queue: "q", ID: "fail-3"},
			outbox.Task{Queue: "q", ID: "4"}, outbox.Task{Queue: "q", ID: "5"})
		return err
	})
	want := []delayqtype.State{delayqtype.StatePending, delayqtype.StateWaiting, delayqtype.StateWaiting, delayqtype.StateWaiting, delayqtype.StateWaiting}
	for i, r := range res {
		if r.State != want[i] {
			t.Fatalf("link %d: %+v", i, r)
		}
	}
	b.work(t, "1", delayq.OutcomeSucceeded)
	if r := b.row(t, "q", "2"); r.state != delayqtype.StatePending {
		t.Fatalf("2: %+v", r)
	}
	if r := b.row(t, "q", "fail-3"); r.state != delayqtype.StateWaiting {
		t.Fatalf("3: %+v", r)
	}
	b.work(t, "2", delayq.OutcomeSucceeded)
	b.kill(t, "fail-3")
	x := b.row(t, "q", "fail-3").xmin
	for _, id := range []string{"4", "5"} {
		r := b.row(t, "q", id)
		if r.state != delayqtype.StateDead || r.xmin != x || !strings.HasPrefix(r.lastError, "dependency q/") {
			t.Errorf("%s: %+v, want dead in transaction %d", id, r, x)
		}
	}
	if got := b.row(t, "q", "5").lastError; got != "dependency q/4 dead: dependency q/fail-3 dead: planned failure" {
		t.Errorf("5's reason: %q", got)
	}

	// Skip: the rest is cancelled.
	b.tx(t, func(tx pgx.Tx) error {
		_, err := b.wf.Chain(ctx, tx, workflow.Skip, outbox.Task{Queue: "q", ID: "s1"}, outbox.Task{Queue: "q", ID: "s2"}, outbox.Task{Queue: "q", ID: "s3"})
		return err
	})
	if err := b.c.Outbox().Cancel(ctx, b.e.Pool, "q", "s1"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"s2", "s3"} {
		if r := b.row(t, "q", id); r.state != delayqtype.StateCancelled {
			t.Errorf("%s: %+v", id, r)
		}
	}
}

// A long chain that fails at its head stops in the head's transaction: no
// nested triggers, whatever its length.
func TestLongChainFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const links = workflow.MaxDependencies
	tasks := make([]outbox.Task, links)
	for i := range tasks {
		tasks[i] = outbox.Task{Queue: "q", ID: fmt.Sprintf("link-%03d", i)}
	}
	tasks[0].ID = "fail-head"
	for k := 0; k < 3; k++ { // chains side by side: 300 links die with one
		b.tx(t, func(tx pgx.Tx) error {
			ts := make([]outbox.Task, len(tasks))
			for i, task := range tasks {
				ts[i] = task
				if i > 0 {
					ts[i].ID = fmt.Sprintf("%s-%d", task.ID, k)
				}
			}
			_, err := b.wf.Chain(ctx, tx, workflow.Fail, ts...)
			return err
		})
	}
	b.kill(t, "fail-head")
	var dead int
	if err := b.e.Pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE state = 'dead'`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != 1+3*(links-1) {
		t.Errorf("%d dead, want %d", dead, 1+3*(links-1))
	}
}

// Bad input is refused with a sentinel, and nothing is written: the caller's
// transaction goes on.
func TestRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.plain(t, "a")
	many := make([]workflow.Dependency, workflow.MaxDependencies+1)
	for i := range many {
		many[i] = workflow.On("q", fmt.Sprint(i))
	}
	tk := outbox.Task{Queue: "r", ID: "x"}
	for _, c := range []struct {
		name string
		call func(tx pgx.Tx) error
		want error
	}{
		{"self", func(tx pgx.Tx) error { _, err := b.wf.Enqueue(ctx, tx, tk, workflow.On("r", "x")); return err }, workflow.ErrCycle},
		{"chain twice", func(tx pgx.Tx) error {
			_, err := b.wf.Chain(ctx, tx, workflow.Fail, tk, outbox.Task{Queue: "r", ID: "y"}, tk)
			return err
		}, workflow.ErrCycle},
		{"too many", func(tx pgx.Tx) error { _, err := b.wf.Enqueue(ctx, tx, tk, many...); return err }, workflow.ErrTooManyDependencies},
		{"unknown", func(tx pgx.Tx) error {
			_, err := b.wf.Enqueue(ctx, tx, tk, workflow.On("q", "a"), workflow.On("q", "nope"), workflow.On("nowhere", "a"))
			if err != nil && !strings.Contains(err.Error(), "q/nope, nowhere/a") {
				t.Errorf("unknown: %v does not name the missing ones", err)
			}
			return err
		}, workflow.ErrUnknownDependency},
		{"policy", func(tx pgx.Tx) error {
			_, err := b.wf.Enqueue(ctx, tx, tk, workflow.Dependency{Queue: "q", ID: "a", OnFailure: 7})
			return err
		}, workflow.ErrInvalidPolicy},
		{"bad queue", func(tx pgx.Tx) error { _, err := b.wf.Enqueue(ctx, tx, tk, workflow.On("q{", "a")); return err }, outbox.ErrInvalidQueue},
		{"bad id", func(tx pgx.Tx) error { _, err := b.wf.Enqueue(ctx, tx, tk, workflow.On("q", "")); return err }, outbox.ErrInvalidTaskID},
		{"bad task", func(tx pgx.Tx) error {
			_, err := b.wf.Enqueue(ctx, tx, outbox.Task{Queue: "r", ID: "x", Delay: -1}, workflow.On("q", "a"))
			return err
		}, outbox.ErrInvalidTask},
	} {
		b.tx(t, func(tx pgx.Tx) error {
			err := c.call(tx)
			if !errors.Is(err, c.want) {
				t.Errorf("%s: %v, want %v", c.name, err, c.want)
			}
			// The transaction is still usable, and nothing was written.
			var n int
			if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM delayq_outbox WHERE queue = 'r') + (SELECT count(*) FROM delayq_deps)
				+ (SELECT count(*) FROM delayq_outbox WHERE has_dependents)`).Scan(&n); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if n != 0 {
				t.Errorf("%s: %d rows written", c.name, n)
			}
			return nil
		})
	}
}

// A duplicate dependent writes nothing; a dependency named twice counts once;
// a waiting task is rescheduled (still waiting) and cancelled like any other.
func TestDuplicateRescheduleCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.plain(t, "a", "b")
	b.tx(t, func(tx pgx.Tx) error {
		_, err := b.wf.Enqueue(ctx, tx, outbox.Task{Queue: "r", ID: "w"}, workflow.On("q", "a"), workflow.On("q", "a"))
		return err
	})
	if r := b.row(t, "r", "w"); *r.waitsFor != 1 {
		t.Fatalf("w: %+v", r)
	}
	var dup workflow.Result
	b.tx(t, func(tx pgx.Tx) error {
		var err error
		dup, err = b.wf.Enqueue(ctx, tx, outbox.Task{Queue: "r", ID: "w"}, workflow.On("q", "b"))
		return err
	})
	if !dup.Duplicate || dup.State != "" {
		t.Fatalf("duplicate: %+v", dup)
	}
	if n := b.edges(t); n != 1 {
		t.Fatalf("%d edges after a duplicate, want 1", n)
	}
	later := time.Now().Add(time.Hour)
	if err := b.c.Outbox().Reschedule(ctx, b.e.Pool, "r", "w", later); err != nil {
		t.Fatal(err)
	}
	if r := b.row(t, "r", "w"); r.state != delayqtype.StateWaiting || r.version != 2 {
		t.Fatalf("rescheduled: %+v", r)
	}
	b.work(t, "a", delayq.OutcomeSucceeded)
	var runAt time.Time
	if err := b.e.Pool.QueryRow(ctx, `SELECT run_at FROM delayq_outbox WHERE queue = 'r' AND task_id = 'w' AND state = 'pending'`).Scan(&runAt); err != nil {
		t.Fatal(err)
	}
	if runAt.Sub(later).Abs() > time.Millisecond {
		t.Errorf("released at %v, want its own run time %v", runAt, later)
	}
	// Cancel a waiting task.
	b.tx(t, func(tx pgx.Tx) error {
		_, err := b.wf.Enqueue(ctx, tx, outbox.Task{Queue: "r", ID: "w2"}, workflow.On("q", "b"))
		return err
	})
	if err := b.c.Outbox().Cancel(ctx, b.e.Pool, "r", "w2"); err != nil {
		t.Fatal(err)
	}
	if r := b.row(t, "r", "w2"); r.state != delayqtype.StateCancelled {
		t.Fatalf("w2: %+v", r)
	}
	b.work(t, "b", delayq.OutcomeSucceeded)
	if r := b.row(t, "r", "w2"); r.state != delayqtype.StateCancelled {
		t.Fatalf("w2 after b: %+v", r)
	}
}

// Many dependencies completing at once, each in its own transaction, release
// their dependent exactly once, with the last of them.
func TestConcurrentCompletions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const n = 40
	ids := make([]string, n)
	deps := make([]workflow.Dependency, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("p%02d", i)
		deps[i] = workflow.On("q", ids[i])
	}
	b.plain(t, ids...)
	for k := range 5 {
		b.tx(t, func(tx pgx.Tx) error {
			_, err := b.wf.Enqueue(ctx, tx, outbox.Task{Queue: "r", ID: fmt.Sprint("w", k)}, deps...)
			return err
		})
	}
	if _, err := b.e.Pool.Exec(ctx, `CREATE TABLE releases (task_id text, at_xid xid8 DEFAULT pg_current_xact_id())`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.e.Pool.Exec(ctx, `CREATE FUNCTION note_release() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO releases (task_id) VALUES (NEW.task_id); RETURN NULL; END $$;
		CREATE TRIGGER note_release AFTER UPDATE OF state ON delayq_outbox FOR EACH ROW
		WHEN (OLD.state = 'waiting' AND NEW.state <> 'waiting') EXECUTE FUNCTION note_release()`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, id := range ids {
		wg.Go(func() {
			// The transition the worker makes, each in a transaction of its own.
			_, err := b.e.Pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'done', done_at = now() WHERE queue = 'q' AND task_id = $1`, id)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	rows, err := b.e.Pool.Query(ctx, `SELECT task_id, count(*) FROM releases GROUP BY task_id`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	var id string
	var c int
	if _, err := pgx.ForEachRow(rows, []any{&id, &c}, func() error { got[id] = c; return nil }); err != nil {
		t.Fatal(err)
	}
	for k := range 5 {
		w := fmt.Sprint("w", k)
		if got[w] != 1 {
			t.Errorf("%s released %d times", w, got[w])
		}
		if r := b.row(t, "r", w); r.state != delayqtype.StatePending || *r.waitsFor != 0 {
			t.Errorf("%s: %+v", w, r)
		}
	}
}

// End to end: a worker with its relay runs a dependent after its
// dependencies, never before.
func TestRunsAfterItsDependencies(t *testing.T) {
	t.Parallel()
	e := delayqtest.New(t, delayqtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := e.Client(t, delayq.Config{Relay: relayConfig()})
	var mu sync.Mutex
	var ran []string
	h := func(_ context.Context, _ pgx.Tx, task *delayq.Task) error {
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, task.ID)
		return nil
	}
	if err := c.HandleTx("q", h, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	wf := workflow.New(c)
	if err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		for _, id := range []string{"reserve", "charge"} {
			if _, err := c.Outbox().Enqueue(ctx, tx, outbox.Task{Queue: "q", ID: id, Delay: 200 * time.Millisecond}); err != nil {
				return err
			}
		}
		_, err := wf.Enqueue(ctx, tx, outbox.Task{Queue: "q", ID: "ship"}, workflow.On("q", "reserve"), workflow.On("q", "charge"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for {
		var st string
		if err := e.Pool.QueryRow(ctx, `SELECT state FROM delayq_outbox WHERE task_id = 'ship'`).Scan(&st); err != nil {
			t.Fatal(err)
		}
		if st == string(delayqtype.StateDone) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("ship is %s", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(ran) != 3 || ran[2] != "ship" {
		t.Errorf("ran %v", ran)
	}
}

func relayConfig() *relay.Config { return &relay.Config{PollInterval: 50 * time.Millisecond} }
