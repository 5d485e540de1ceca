package delayqtest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtest"
	"github.com/delayq/delayq/internal/tempserver/fakedocker"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/migrations"
	"github.com/delayq/delayq/outbox"
)

func TestMain(m *testing.M) {
	fakedocker.Main() // this binary is the docker command of TestServersInDocker
	delayqtest.Main(m)
}

// env makes a delayqtest.Env on the servers of the environment, else on the
// local ones delayqtest starts, and a client on it.
func env(t *testing.T) (*delayqtest.Env, *delayq.Client) {
	e := delayqtest.New(t, delayqtest.Options{})
	return e, e.Client(t, delayq.Config{})
}

type charge struct {
	Order string `json:"order"`
	Cents int    `json:"cents"`
}

var charges = outbox.Queue[charge]{Name: "charge"}

// fatal runs f with a testing.TB that records its failure instead of failing t,
// and returns the message ("" when f did not fail).
func fatal(t *testing.T, f func(tb testing.TB)) string {
	tb := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(tb)
	}()
	<-done
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.msg
}

type recorder struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatal(args ...any) {
	r.mu.Lock()
	r.msg = fmt.Sprint(args...)
	r.mu.Unlock()
	runtime.Goexit()
}
func (r *recorder) Fatalf(format string, args ...any) { r.Fatal(fmt.Sprintf(format, args...)) }

func TestRequireEnqueued(t *testing.T) {
	t.Parallel()
	e, c := env(t)
	ctx := context.Background()
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	due := time.Now().Add(time.Hour)
	if _, err := charges.Enqueue(ctx, c, tx, outbox.Task{ID: "order-1", RunAt: due}, charge{"order-1", 990}); err != nil {
		t.Fatal(err)
	}
	got := delayqtest.RequireEnqueued(ctx, t, tx, delayqtest.Want{Queue: "charge", ID: "order-1",
		Payload: delayqtest.Equal(charges, charge{"order-1", 990}), RunAt: due})
	if got.State != "pending" || got.Version != 1 || got.MaxAttempts != validate.DefaultMaxAttempts {
		t.Errorf("found %+v", got)
	}
	delayqtest.RequireEnqueued(ctx, t, tx, delayqtest.Want{Queue: "charge"})
	delayqtest.RequireNotEnqueued(ctx, t, tx, delayqtest.Want{Queue: "charge", ID: "order-2"})
	delayqtest.RequireNotEnqueued(ctx, t, e.Pool, delayqtest.Want{Queue: "charge"}) // not committed

	for _, tc := range []struct {
		want delayqtest.Want
		msg  string
	}{
		{delayqtest.Want{Queue: "charge", ID: "order-2"}, `no task enqueued into "charge" with id order-2`},
		{delayqtest.Want{Queue: "charge", Payload: delayqtest.Equal(charges, charge{"order-1", 1})}, "payload {Order:order-1 Cents:990}, want {Order:order-1 Cents:1}"},
		{delayqtest.Want{Queue: "charge", RunAt: due.Add(time.Minute)}, "charge/order-1: due"},
		{delayqtest.Want{Queue: "charge", Payload: delayqtest.Match(outbox.Queue[[]int]{Name: "charge"}, func([]int) error { return nil })}, "invalid payload"},
		{delayqtest.Want{}, "Want.Queue is required"},
	} {
		if msg := fatal(t, func(tb testing.TB) { delayqtest.RequireEnqueued(ctx, tb, tx, tc.want) }); !strings.Contains(msg, tc.msg) {
			t.Errorf("RequireEnqueued(%+v) failed with %q, want %q", tc.want, msg, tc.msg)
		}
	}
	if msg := fatal(t, func(tb testing.TB) {
		delayqtest.RequireNotEnqueued(ctx, tb, tx, delayqtest.Want{Queue: "charge", RunAt: due, Within: time.Second})
	}); !strings.Contains(msg, "task charge/order-1 is enqueued (pending), want none") {
		t.Errorf("RequireNotEnqueued failed with %q", msg)
	}
}

func TestRequireEnqueuedSQL(t *testing.T) {
	t.Parallel()
	e, c := env(t)
	ctx := context.Background()
	db, err := migrations.OpenDB(e.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := charges.EnqueueSQL(ctx, c, tx, outbox.Task{ID: "order-7", Delay: time.Minute}, charge{"order-7", 5}); err != nil {
		t.Fatal(err)
	}
	delayqtest.RequireEnqueuedSQL(ctx, t, tx, delayqtest.Want{Queue: "charge", ID: "order-7",
		Payload: delayqtest.Equal(charges, charge{"order-7", 5}), RunAt: time.Now().Add(time.Minute), Within: 10 * time.Second})
	delayqtest.RequireNotEnqueuedSQL(ctx, t, tx, delayqtest.Want{Queue: "refund"})
	if msg := fatal(t, func(tb testing.TB) { delayqtest.RequireNotEnqueuedSQL(ctx, tb, tx, delayqtest.Want{Queue: "charge"}) }); msg == "" {
		t.Error("RequireNotEnqueuedSQL did not fail")
	}
}

// Work runs one task now, whatever its due time, through the worker's guard and
// hooks; the effect commits once, and a second delivery is suppressed.
func TestWork(t *testing.T) {
	t.Parallel()
	e, c := env(t)
	ctx := context.Background()
	if _, err := e.Pool.Exec(ctx, `CREATE TABLE ledger (order_id text, cents int); CREATE TABLE failed (order_id text)`); err != nil {
		t.Fatal(err)
	}
	err := delayq.RegisterTx(c, charges, func(ctx context.Context, tx pgx.Tx, _ *delayq.Task, c charge) error {
		if c.Cents < 0 {
			return delayq.NoRetry(errors.New("negative charge"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, $2)`, c.Order, c.Cents)
		return err
	}, delayq.QueueConfig{OnDead: func(ctx context.Context, tx pgx.Tx, tk *delayq.Task, _ error) error {
		_, err := tx.Exec(ctx, `INSERT INTO failed VALUES ($1)`, tk.ID)
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range []charge{{"o-1", 100}, {"o-2", -1}} {
		if _, err := charges.Enqueue(ctx, c, e.Pool, outbox.Task{ID: ch.Order, Delay: time.Hour}, ch); err != nil {
			t.Fatal(err)
		}
	}
	if res := e.Work(ctx, t, c, "charge", "o-1"); res.Outcome != delayq.OutcomeSucceeded || res.Err != nil || res.Task.Attempt != 1 {
		t.Errorf("o-1: %+v", res)
	}
	if res := e.Work(ctx, t, c, "charge", "o-2"); res.Outcome != delayq.OutcomeDead || res.Err == nil {
		t.Errorf("o-2: %+v", res)
	}
	var ledger, failed int
	if err := e.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ledger), (SELECT count(*) FROM failed)`).Scan(&ledger, &failed); err != nil {
		t.Fatal(err)
	}
	if ledger != 1 || failed != 1 {
		t.Errorf("ledger %d, failed %d", ledger, failed)
	}
	// Redis holds the dead one alone: the done one was acknowledged.
	st, err := c.Stats(ctx, "charge")
	if err != nil {
		t.Fatal(err)
	}
	if st[0].Ready != 0 || st[0].Active != 0 || st[0].Dead != 1 {
		t.Errorf("redis %+v", st[0])
	}
	if msg := fatal(t, func(tb testing.TB) { e.Work(ctx, tb, c, "charge", "o-1") }); !strings.Contains(msg, "task charge/o-1 is done") {
		t.Errorf("Work of a done task failed with %q", msg)
	}
	if msg := fatal(t, func(tb testing.TB) { e.Work(ctx, tb, c, "charge", "o-3") }); !strings.Contains(msg, "no task charge/o-3") {
		t.Errorf("Work of a missing task failed with %q", msg)
	}
}

// Work hands the handler the task as the relay would: its trace context and
// start deadline too (the kit once built the task by hand and left them out).
func TestWorkHandsTheRelaysTask(t *testing.T) {
	t.Parallel()
	e, c := env(t)
	ctx := context.Background()
	var got *delayq.Task
	if err := delayq.Register(c, charges, func(_ context.Context, tk *delayq.Task, _ charge) error {
		got = tk
		return nil
	}, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	const trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	startBy := time.Now().Add(2 * time.Hour).Truncate(time.Millisecond)
	if _, err := charges.Enqueue(ctx, c, e.Pool, outbox.Task{ID: "o-9", Delay: time.Hour, TraceContext: trace,
		StartBy: startBy, Priority: 3}, charge{"o-9", 1}); err != nil {
		t.Fatal(err)
	}
	if res := e.Work(ctx, t, c, "charge", "o-9"); res.Outcome != delayq.OutcomeSucceeded || got == nil {
		t.Fatalf("o-9: %+v", res)
	}
	if got.TraceContext != trace || !got.StartBy.Equal(startBy) {
		t.Errorf("the handler got trace context %q, start deadline %v; want %q, %v", got.TraceContext, got.StartBy, trace, startBy)
	}
}
