package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtest"
	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/workflow"
)

// children returns n plain tasks of queue q named prefix0000...
func children(q, prefix string, n int) []outbox.Task {
	out := make([]outbox.Task, n)
	for i := range out {
		out[i] = outbox.Task{Queue: q, ID: fmt.Sprintf("%s%05d", prefix, i)}
	}
	return out
}

// noteReleases records, with its transaction id, every time a waiting row
// leaves waiting (the test's own trigger), and returns a reader of the count
// per task id.
func noteReleases(t *testing.T, b *bundle) func() map[string]int {
	t.Helper()
	ctx := context.Background()
	if _, err := b.e.Pool.Exec(ctx, `CREATE TABLE releases (task_id text, state text, at_xid xid8 DEFAULT pg_current_xact_id());
		CREATE FUNCTION note_release() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO releases (task_id, state) VALUES (NEW.task_id, NEW.state); RETURN NULL; END $$;
		CREATE TRIGGER note_release AFTER UPDATE OF state ON delayq_outbox FOR EACH ROW
		WHEN (OLD.state = 'waiting' AND NEW.state <> 'waiting') EXECUTE FUNCTION note_release()`); err != nil {
		t.Fatal(err)
	}
	return func() map[string]int {
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
		return got
	}
}

func (b *bundle) batch(t *testing.T, cb outbox.Task, kids []outbox.Task) workflow.BatchResult {
	t.Helper()
	var r workflow.BatchResult
	b.tx(t, func(tx pgx.Tx) (err error) {
		r, err = b.wf.Batch(context.Background(), tx, cb, kids)
		return err
	})
	return r
}

func (b *bundle) counts(t *testing.T, queue, id string) workflow.BatchCounts {
	t.Helper()
	c, err := b.wf.BatchCounts(context.Background(), b.e.Pool, queue, id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The children of a batch finish concurrently (done, dead and cancelled, from
// eight goroutines, each finish a transaction of its own as a worker's): the
// callback is released exactly once, by the transaction of the last finish,
// and the counts say how each child ended.
func TestBatchCallbackOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const n = 300
	kids := children("q", "c", n)
	kids[1].ID = "fail-1" // the handler fails it
	res := b.batch(t, outbox.Task{Queue: "r", ID: "cb"}, kids)
	if res.Duplicate || res.Children != n || res.Duplicates != 0 {
		t.Fatalf("batch: %+v", res)
	}
	if r := b.row(t, "r", "cb"); r.state != delayqtype.StateWaiting {
		t.Fatalf("callback: %+v", r)
	}
	released := noteReleases(t, b)
	// One child through the worker's transactional completion, one through its
	// last attempt's death, the rest by the same updates from goroutines.
	b.work(t, kids[0].ID, delayq.OutcomeSucceeded)
	b.kill(t, kids[1].ID)
	work := make(chan int, n)
	for i := 2; i < n; i++ {
		work <- i
	}
	close(work)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range 8 {
		wg.Go(func() {
			for i := range work {
				var err error
				switch i % 10 {
				case 3:
					_, err = b.e.Pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'dead', done_at = now() WHERE queue = 'q' AND task_id = $1`, kids[i].ID)
				case 7:
					err = b.c.Outbox().Cancel(ctx, b.e.Pool, "q", kids[i].ID)
				default:
					_, err = b.e.Pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'done', done_at = now() WHERE queue = 'q' AND task_id = $1`, kids[i].ID)
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := released(); got["cb"] != 1 || len(got) != 1 {
		t.Errorf("releases: %v", got)
	}
	if r := b.row(t, "r", "cb"); r.state != delayqtype.StatePending {
		t.Errorf("callback: %+v", r)
	}
	c := b.counts(t, "r", "cb")
	wantDead, wantCancelled := 1, 0
	for i := 2; i < n; i++ {
		switch i % 10 {
		case 3:
			wantDead++
		case 7:
			wantCancelled++
		}
	}
	if c.Total != n || c.Remaining != 0 || c.Dead != wantDead || c.Cancelled != wantCancelled || c.Done != n-wantDead-wantCancelled || c.FinishedAt.IsZero() {
		t.Errorf("counts %+v, want %d dead, %d cancelled", c, wantDead, wantCancelled)
	}
	// The release is in the transaction that finished the last child: the
	// callback's row version and the last child's were written by one xid.
	var same bool
	if err := b.e.Pool.QueryRow(ctx, `SELECT (SELECT at_xid FROM releases WHERE task_id = 'cb') =
		(SELECT xmin::text::xid8 FROM delayq_outbox WHERE queue = 'r' AND task_id = 'cb')`).Scan(&same); err != nil {
		t.Fatal(err)
	}
	if !same {
		t.Error("the callback was not released by the transaction that recorded its release")
	}
	// A child counts once: a dead child retried and finishing again changes
	// nothing.
	if _, err := b.e.Pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'pending', version = version + 1, done_at = NULL WHERE queue = 'q' AND task_id = $1`, kids[3].ID); err != nil {
		t.Fatal(err)
	}
	b.work(t, kids[3].ID, delayq.OutcomeSucceeded)
	if c2 := b.counts(t, "r", "cb"); c2 != c {
		t.Errorf("counts after a retried child: %+v, were %+v", c2, c)
	}
	if got := released(); got["cb"] != 1 {
		t.Errorf("releases: %v", got)
	}
}

// A batch of 100,000 children (10,000 with -short) is one statement; a
// child that existed is left out; the same call again is a duplicate; one
// statement finishing every child releases the callback once.
func TestBatchLarge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	n := workflow.MaxBatch
	if testing.Short() {
		n = 10_000
	}
	kids := children("q", "k", n)
	kids[0].Payload = []byte("first")
	kids[1].Delay = time.Hour
	kids[2].Priority = 3
	b.plain(t, kids[5].ID)
	start := time.Now()
	res := b.batch(t, outbox.Task{Queue: "r", ID: "big"}, kids)
	t.Logf("%d children enqueued in %v", n, time.Since(start))
	if res.Children != n-1 || res.Duplicates != 1 || res.Duplicate || res.RunAt.IsZero() {
		t.Fatalf("batch: %+v", res)
	}
	if again := b.batch(t, outbox.Task{Queue: "r", ID: "big"}, kids[:3]); !again.Duplicate {
		t.Errorf("again: %+v", again)
	}
	var inBatch, withPayload, prio int
	if err := b.e.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE batch_id IS NOT NULL AND task_id <> 'big'),
		count(*) FILTER (WHERE payload = 'first'), max(priority) FROM delayq_outbox`).Scan(&inBatch, &withPayload, &prio); err != nil {
		t.Fatal(err)
	}
	if inBatch != n-1 || withPayload != 1 || prio != 3 {
		t.Errorf("%d rows in the batch, %d with the payload, priority %d", inBatch, withPayload, prio)
	}
	released := noteReleases(t, b)
	if _, err := b.e.Pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'done', done_at = now() WHERE queue = 'q' AND state IN ('pending', 'queued')`); err != nil {
		t.Fatal(err)
	}
	if got := released(); got["big"] != 1 {
		t.Errorf("releases: %v", got)
	}
	if c := b.counts(t, "r", "big"); c.Total != n-1 || c.Done != n-1 || c.Remaining != 0 {
		t.Errorf("counts: %+v", c)
	}
}

// A batch whose children all existed runs its callback at once; bad batches
// are refused with nothing written.
func TestBatchEmptyAndRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.plain(t, "x", "y")
	res := b.batch(t, outbox.Task{Queue: "r", ID: "cb"}, []outbox.Task{{Queue: "q", ID: "x"}, {Queue: "q", ID: "y"}})
	if res.Children != 0 || res.Duplicates != 2 {
		t.Fatalf("batch: %+v", res)
	}
	if r := b.row(t, "r", "cb"); r.state != delayqtype.StatePending {
		t.Errorf("callback of an empty batch: %+v", r)
	}
	for name, tc := range map[string]struct {
		cb   outbox.Task
		kids []outbox.Task
		want error
	}{
		"twice":        {outbox.Task{Queue: "r", ID: "b1"}, []outbox.Task{{Queue: "q", ID: "a"}, {Queue: "q", ID: "b"}, {Queue: "q", ID: "a"}}, workflow.ErrCycle},
		"itself":       {outbox.Task{Queue: "r", ID: "b2"}, []outbox.Task{{Queue: "r", ID: "b2"}}, workflow.ErrCycle},
		"too many":     {outbox.Task{Queue: "r", ID: "b3"}, make([]outbox.Task, workflow.MaxBatch+1), workflow.ErrTooManyDependencies},
		"bad child":    {outbox.Task{Queue: "r", ID: "b4"}, []outbox.Task{{Queue: "", ID: "a"}}, outbox.ErrInvalidQueue},
		"bad callback": {outbox.Task{Queue: "r", ID: ""}, nil, outbox.ErrInvalidTaskID},
	} {
		err := pgx.BeginFunc(ctx, b.e.Pool, func(tx pgx.Tx) error {
			_, err := b.wf.Batch(ctx, tx, tc.cb, tc.kids)
			return err
		})
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	var rows int
	if err := b.e.Pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox`).Scan(&rows); err != nil || rows != 3 {
		t.Errorf("%d rows (%v), want 3", rows, err)
	}
	if _, err := b.wf.BatchCounts(ctx, b.e.Pool, "q", "x"); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("counts of a task that is no callback: %v", err)
	}
}

// Cancelling a batch mid-way cancels its children not finished and its
// callback; the counts keep those that finished before. Named by a child, the
// whole batch is cancelled too.
func TestCancelBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	kids := children("q", "c", 10)
	kids[3].ID = "fail-3" // the handler fails it
	b.batch(t, outbox.Task{Queue: "r", ID: "cb"}, kids)
	for _, k := range kids[:3] {
		b.work(t, k.ID, delayq.OutcomeSucceeded)
	}
	b.kill(t, kids[3].ID)
	released := noteReleases(t, b)
	var n int
	b.tx(t, func(tx pgx.Tx) (err error) {
		n, err = b.wf.Cancel(ctx, tx, "q", kids[5].ID)
		return err
	})
	if n != 7 {
		t.Errorf("cancelled %d, want 6 children and the callback", n)
	}
	if r := b.row(t, "r", "cb"); r.state != delayqtype.StateCancelled {
		t.Errorf("callback: %+v", r)
	}
	if c := b.counts(t, "r", "cb"); c.Done != 3 || c.Dead != 1 || c.Cancelled != 6 || c.Remaining != 0 {
		t.Errorf("counts: %+v", c)
	}
	if got := released(); got["cb"] != 1 {
		t.Errorf("callback left waiting %d times", got["cb"])
	}
	if r := b.row(t, "q", kids[9].ID); r.state != delayqtype.StateCancelled {
		t.Errorf("cancelled child: %+v", r)
	}
	// Again: nothing left to cancel.
	b.tx(t, func(tx pgx.Tx) (err error) {
		n, err = b.wf.Cancel(ctx, tx, "r", "cb")
		return err
	})
	if n != 0 {
		t.Errorf("second cancel: %d", n)
	}
	if _, err := b.wf.Cancel(ctx, b.e.Pool, "q", "nope"); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("cancel of no task: %v", err)
	}
}

// A batch cancelled while the completions of its last children run
// concurrently: every child ends finished and counted once, the callback is
// cancelled and never released, and nothing deadlocks.
func TestCancelBatchConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	kids := children("q", "c", 200)
	b.batch(t, outbox.Task{Queue: "r", ID: "cb"}, kids)
	released := noteReleases(t, b)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 4 {
		wg.Go(func() {
			for i := g; i < len(kids); i += 4 {
				if _, err := b.e.Pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'done', done_at = now() WHERE queue = 'q' AND task_id = $1 AND state IN ('pending', 'queued')`, kids[i].ID); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Go(func() {
		errs <- pgx.BeginFunc(ctx, b.e.Pool, func(tx pgx.Tx) error {
			_, err := b.wf.Cancel(ctx, tx, "r", "cb")
			return err
		})
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	c := b.counts(t, "r", "cb")
	if c.Remaining != 0 || c.Done+c.Cancelled != len(kids) {
		t.Errorf("counts: %+v", c)
	}
	var done, cancelled int
	if err := b.e.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state = 'cancelled')
		FROM delayq_outbox WHERE queue = 'q'`).Scan(&done, &cancelled); err != nil {
		t.Fatal(err)
	}
	if done != c.Done || cancelled != c.Cancelled {
		t.Errorf("rows: %d done, %d cancelled; counts %+v", done, cancelled, c)
	}
	if r := b.row(t, "r", "cb"); r.state != delayqtype.StateCancelled {
		t.Errorf("callback: %+v", r)
	}
	if got := released(); got["cb"] != 1 {
		t.Errorf("callback left waiting %d times, want once (cancelled)", got["cb"])
	}
}

// Cancelling a chain mid-way, named by its last task, cancels the link that
// is due and every link waiting: none goes dead (the policy Fail would kill
// the rest if only the due link were cancelled), and the link already done
// stays done.
func TestCancelChain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	links := children("q", "l", 5)
	b.tx(t, func(tx pgx.Tx) error {
		_, err := b.wf.Chain(ctx, tx, workflow.Fail, links...)
		return err
	})
	b.work(t, links[0].ID, delayq.OutcomeSucceeded)
	var n int
	b.tx(t, func(tx pgx.Tx) (err error) {
		n, err = b.wf.Cancel(ctx, tx, "q", links[4].ID)
		return err
	})
	if n != 4 {
		t.Errorf("cancelled %d, want 4", n)
	}
	if r := b.row(t, "q", links[0].ID); r.state != delayqtype.StateDone {
		t.Errorf("first link: %+v", r)
	}
	for _, l := range links[1:] {
		if r := b.row(t, "q", l.ID); r.state != delayqtype.StateCancelled || r.lastError != "" {
			t.Errorf("%s: %+v", l.ID, r)
		}
	}
	if e := b.edges(t); e != 0 {
		t.Errorf("%d edges left", e)
	}
}

// End to end: a worker with its relay runs the children (some die), and the
// callback once after them, reading the final counts in its own transaction.
func TestBatchRunsCallbackAfterChildren(t *testing.T) {
	t.Parallel()
	e := delayqtest.New(t, delayqtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := e.Client(t, delayq.Config{Relay: relayConfig()})
	wf := workflow.New(c)
	var mu sync.Mutex
	ran := map[string]int{}
	var seen workflow.BatchCounts
	finished := make(chan struct{})
	if err := c.HandleTx("resize", func(_ context.Context, _ pgx.Tx, task *delayq.Task) error {
		mu.Lock()
		defer mu.Unlock()
		ran[task.ID]++
		if len(task.Payload) > 0 {
			return delayq.NoRetry(errors.New("corrupt image"))
		}
		return nil
	}, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := c.HandleTx("album", func(ctx context.Context, tx pgx.Tx, task *delayq.Task) error {
		counts, err := wf.BatchCounts(ctx, tx, task.Queue, task.ID)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		ran[task.ID]++
		seen = counts
		if ran[task.ID] == 1 {
			close(finished)
		}
		return nil
	}, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	kids := children("resize", "img", 20)
	kids[4].Payload, kids[11].Payload = []byte("x"), []byte("x")
	if err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		_, err := wf.Batch(ctx, tx, outbox.Task{Queue: "album", ID: "album-1"}, kids)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-finished:
	case <-ctx.Done():
		t.Fatal("the callback did not run")
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if ran["album-1"] != 1 || seen.Total != 20 || seen.Done != 18 || seen.Dead != 2 || seen.Remaining != 0 {
		t.Errorf("callback ran %d times, saw %+v", ran["album-1"], seen)
	}
	for _, k := range kids {
		if ran[k.ID] != 1 {
			t.Errorf("%s ran %d times", k.ID, ran[k.ID])
		}
	}
}

// The relay hears of a release at its commit: a dependent released by its
// dependency's completion, and a batch's callback released by its last
// child's, each notify the relay's channel (without it the relay finds them
// only at its next poll).
func TestReleaseNotifiesRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	conn, err := b.e.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `LISTEN delayq_outbox`); err != nil {
		t.Fatal(err)
	}
	b.plain(t, "a")
	b.tx(t, func(tx pgx.Tx) error {
		if _, err := b.wf.Enqueue(ctx, tx, outbox.Task{Queue: "r", ID: "dep"}, workflow.On("q", "a")); err != nil {
			return err
		}
		_, err := b.wf.Batch(ctx, tx, outbox.Task{Queue: "r", ID: "cb"}, []outbox.Task{{Queue: "q", ID: "kid", Delay: time.Hour}})
		return err
	})
	for _, id := range []string{"a", "kid"} {
		drain, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		for { // the notifications of the enqueues
			if _, err := conn.Conn().WaitForNotification(drain); err != nil {
				break
			}
		}
		cancel()
		if _, err := b.e.Pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'done', done_at = now() WHERE queue = 'q' AND task_id = $1`, id); err != nil {
			t.Fatal(err)
		}
		wait, cancel := context.WithTimeout(ctx, 5*time.Second)
		n, err := conn.Conn().WaitForNotification(wait)
		cancel()
		if err != nil || n.Payload != "r" {
			t.Errorf("release by %s: notification %+v, %v", id, n, err)
		}
	}
}

// A task that waits on a batch's callback and on that batch's last child:
// cancelling it cancels the three in one transaction. The child's cancel
// finishes the batch, whose callback the same cancel takes: the callback is
// cancelled, not released, and nothing fails (it did, with "tuple to be
// updated was already modified by an operation triggered by the current
// command").
func TestCancelWalkHoldsBatchCallbackAndLastChild(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	kids := children("q", "k", 2)
	b.batch(t, outbox.Task{Queue: "q", ID: "cb"}, kids)
	b.work(t, kids[0].ID, delayq.OutcomeSucceeded)
	b.tx(t, func(tx pgx.Tx) error {
		_, err := b.wf.Enqueue(ctx, tx, outbox.Task{Queue: "q", ID: "after"}, workflow.On("q", "cb"), workflow.On("q", kids[1].ID))
		return err
	})
	var n int
	b.tx(t, func(tx pgx.Tx) (err error) {
		n, err = b.wf.Cancel(ctx, tx, "q", "after")
		return err
	})
	if n != 3 {
		t.Errorf("cancelled %d, want 3 (the last child, the callback, the task after them)", n)
	}
	for _, id := range []string{kids[1].ID, "cb", "after"} {
		if r := b.row(t, "q", id); r.state != delayqtype.StateCancelled {
			t.Errorf("%s: %+v, want cancelled", id, r)
		}
	}
	if c := b.counts(t, "q", "cb"); c.Remaining != 0 || c.Done != 1 || c.Cancelled != 1 {
		t.Errorf("batch counts %+v, want 1 done, 1 cancelled, none remaining", c)
	}
}
