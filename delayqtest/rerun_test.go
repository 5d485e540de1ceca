package delayqtest_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtest"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// Work runs a task again whatever Redis holds for it: after a failed run (its
// backoff) and after a snooze (TestWorkTakesOverALease: a leased one). (Once the
// second Work failed with "ran <nil>": the kit re-enqueued a duplicate of the
// hash at the same version, and the task stayed at its backoff.)
func TestWorkRunsAgain(t *testing.T) {
	t.Parallel()
	e, c := env(t)
	ctx := context.Background()
	var runs atomic.Int32
	plan := map[int32]error{1: errors.New("card declined"), 2: delayq.Snooze(time.Hour)}
	if err := delayq.Register(c, charges, func(context.Context, *delayq.Task, charge) error {
		return plan[runs.Add(1)]
	}, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := charges.Enqueue(ctx, c, e.Pool, outbox.Task{ID: "o-1", Delay: time.Hour}, charge{"o-1", 5}); err != nil {
		t.Fatal(err)
	}
	if res := e.Work(ctx, t, c, "charge", "o-1"); res.Outcome != delayq.OutcomeRetried || res.Task.Attempt != 1 {
		t.Fatalf("run 1: %+v", res)
	}
	if res := e.Work(ctx, t, c, "charge", "o-1"); res.Outcome != delayq.OutcomeSnoozed || res.Task.Attempt != 2 {
		t.Fatalf("run 2, after a retry's backoff: %+v", res)
	}
	if res := e.Work(ctx, t, c, "charge", "o-1"); res.Outcome != delayq.OutcomeSucceeded || res.Task.Attempt != 2 {
		t.Fatalf("run 3, after a snooze (the attempt not counted): %+v", res)
	}
	if n := runs.Load(); n != 3 {
		t.Errorf("%d runs, want 3", n)
	}
}

// Work takes over a run whose worker holds the lease (a run that lost it, as far
// as the test is concerned): the old lease's token no longer acknowledges it.
func TestWorkTakesOverALease(t *testing.T) {
	t.Parallel()
	e, c := env(t)
	ctx := context.Background()
	if err := delayq.Register(c, charges, func(context.Context, *delayq.Task, charge) error { return nil }, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := charges.Enqueue(ctx, c, e.Pool, outbox.Task{ID: "o-1"}, charge{"o-1", 5}); err != nil {
		t.Fatal(err)
	}
	if res := e.Work(ctx, t, c, "charge", "o-1"); res.Outcome != delayq.OutcomeSucceeded {
		t.Fatalf("run: %+v", res)
	}
	if _, err := charges.Enqueue(ctx, c, e.Pool, outbox.Task{ID: "o-2"}, charge{"o-2", 5}); err != nil {
		t.Fatal(err)
	}
	// The relay's move, and a claim by a worker that then stalls.
	dq, err := dispatch.New(e.Redis, dispatch.Config{Prefix: e.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dq.Enqueue(ctx, "charge", dispatch.Task{ID: "o-2", Payload: []byte(`{"order":"o-2","cents":5}`), Version: 1}); err != nil {
		t.Fatal(err)
	}
	claim, err := dq.Claim(ctx, "charge", 1, time.Hour)
	if err != nil || len(claim.Tasks) != 1 {
		t.Fatalf("claim: %+v, %v", claim, err)
	}
	if res := e.Work(ctx, t, c, "charge", "o-2"); res.Outcome != delayq.OutcomeSucceeded || res.Task.Attempt != 1 {
		t.Fatalf("run of a leased task: %+v", res)
	}
	if err := dq.Complete(ctx, "charge", "o-2", claim.Tasks[0].Token); !errors.Is(err, dispatch.ErrLeaseLost) {
		t.Errorf("the stalled worker's completion: %v, want ErrLeaseLost", err)
	}
	st, err := c.Stats(ctx, "charge")
	if err != nil {
		t.Fatal(err)
	}
	if st[0].Ready != 0 || st[0].Active != 0 {
		t.Errorf("redis after the run: %+v", st[0])
	}
}

// WorkLastAttempt: a failure makes the task dead at once and runs OnDead in the
// transaction that records the death; a success is a success.
func TestWorkLastAttempt(t *testing.T) {
	t.Parallel()
	e, c := env(t)
	ctx := context.Background()
	if _, err := e.Pool.Exec(ctx, `CREATE TABLE refunds (order_id text, reason text)`); err != nil {
		t.Fatal(err)
	}
	if err := delayq.RegisterTx(c, charges, func(_ context.Context, _ pgx.Tx, _ *delayq.Task, ch charge) error {
		if ch.Cents > 1000 {
			return errors.New("card declined")
		}
		return nil
	}, delayq.QueueConfig{OnDead: func(ctx context.Context, tx pgx.Tx, tk *delayq.Task, cause error) error {
		_, err := tx.Exec(ctx, `INSERT INTO refunds VALUES ($1, $2)`, tk.ID, cause.Error())
		return err
	}}); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []charge{{"big", 5000}, {"small", 5}} {
		if _, err := charges.Enqueue(ctx, c, e.Pool, outbox.Task{ID: ch.Order, Delay: time.Hour}, ch); err != nil {
			t.Fatal(err)
		}
	}
	if res := e.Work(ctx, t, c, "charge", "big"); res.Outcome != delayq.OutcomeRetried {
		t.Fatalf("first run: %+v", res)
	}
	res := e.WorkLastAttempt(ctx, t, c, "charge", "big")
	if res.Outcome != delayq.OutcomeDead || res.Task.Attempt != res.Task.MaxAttempts {
		t.Fatalf("last run: %+v", res)
	}
	var id, reason string
	if err := e.Pool.QueryRow(ctx, `SELECT order_id, reason FROM refunds`).Scan(&id, &reason); err != nil {
		t.Fatalf("OnDead did not run: %v", err)
	}
	if id != "big" || !strings.Contains(reason, "card declined") {
		t.Errorf("OnDead got %s, %q", id, reason)
	}
	got := delayqtest.RequireEnqueued(ctx, t, e.Pool, delayqtest.Want{Queue: "charge", ID: "big"})
	if got.State != "dead" || got.Attempt != validate.DefaultMaxAttempts {
		t.Errorf("the row: %+v", got)
	}
	if res := e.WorkLastAttempt(ctx, t, c, "charge", "small"); res.Outcome != delayq.OutcomeSucceeded {
		t.Errorf("a last attempt that succeeds: %+v", res)
	}
}

// With no URL set, New starts local servers from the binaries (this machine and
// CI have them), once for the test binary.
func TestNewStartsLocalServers(t *testing.T) {
	t.Setenv(delayqtest.EnvPostgresURL, "")
	t.Setenv(delayqtest.EnvRedisURL, "")
	ctx := context.Background()
	var urls []string
	for range 2 {
		e := delayqtest.New(t, delayqtest.Options{})
		c := e.Client(t, delayq.Config{})
		if err := delayq.Register(c, charges, func(context.Context, *delayq.Task, charge) error { return nil }, delayq.QueueConfig{}); err != nil {
			t.Fatal(err)
		}
		if _, err := charges.Enqueue(ctx, c, e.Pool, outbox.Task{ID: "o-1", Delay: time.Hour}, charge{"o-1", 5}); err != nil {
			t.Fatal(err)
		}
		if res := e.Work(ctx, t, c, "charge", "o-1"); res.Outcome != delayq.OutcomeSucceeded {
			t.Fatalf("run: %+v", res)
		}
		urls = append(urls, e.Redis.Options().Addr)
	}
	if urls[0] != urls[1] {
		t.Errorf("two Redis servers in one test binary: %v", urls)
	}
}
