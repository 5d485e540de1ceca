package delayqtest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtest"
	"github.com/delayq/delayq/outbox"
)

// placeOrder is the application code under test: the order and its charge
// commit together. The producer is the application's delayq client.
func placeOrder(ctx context.Context, p outbox.Producer, tx pgx.Tx, id string, cents int) error {
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, cents) VALUES ($1, $2)`, id, cents); err != nil {
		return err
	}
	_, err := charges.Enqueue(ctx, p, tx, outbox.Task{ID: id, Delay: 30 * time.Minute}, charge{id, cents})
	return err
}

// A test of one's own code: what placeOrder enqueued, then the charge handler
// run at once through a real worker. (It runs as a test, with t; the servers are
// those of DELAYQ_TEST_POSTGRES_URL and DELAYQ_TEST_REDIS_URL, or local ones
// New starts.)
func Example() {
	var t testing.TB // the test's
	ctx := context.Background()
	e := delayqtest.New(t, delayqtest.Options{})
	c := e.Client(t, delayq.Config{}) // the application's client, on the test's database and prefix
	_, _ = e.Pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, cents int, paid bool DEFAULT false)`)

	err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		if err := placeOrder(ctx, c, tx, "order-1", 1250); err != nil {
			return err
		}
		delayqtest.RequireEnqueued(ctx, t, tx, delayqtest.Want{
			Queue: charges.Name, ID: "order-1",
			Payload: delayqtest.Equal(charges, charge{"order-1", 1250}),
			RunAt:   time.Now().Add(30 * time.Minute), Within: time.Minute,
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	_ = delayq.RegisterTx(c, charges, func(ctx context.Context, tx pgx.Tx, _ *delayq.Task, c charge) error {
		_, err := tx.Exec(ctx, `UPDATE orders SET paid = true WHERE id = $1`, c.Order)
		return err
	}, delayq.QueueConfig{})
	res := e.Work(ctx, t, c, charges.Name, "order-1") // now, not in 30 minutes
	if res.Outcome != delayq.OutcomeSucceeded {
		t.Fatalf("charge: %v %v", res.Outcome, res.Err)
	}
}

// A failed run and the next one: Work runs the task again at once, whatever
// its backoff, and WorkLastAttempt runs it as its last attempt, so that a
// failure reaches the queue's OnDead hook.
func ExampleEnv_WorkLastAttempt() {
	var t testing.TB // the test's
	ctx := context.Background()
	e := delayqtest.New(t, delayqtest.Options{})
	c := e.Client(t, delayq.Config{})
	var refunded []string
	_ = delayq.Register(c, charges, func(context.Context, *delayq.Task, charge) error {
		return errors.New("card declined")
	}, delayq.QueueConfig{OnDead: func(_ context.Context, _ pgx.Tx, task *delayq.Task, _ error) error {
		refunded = append(refunded, task.ID)
		return nil
	}})
	_, _ = charges.Enqueue(ctx, c, e.Pool, outbox.Task{ID: "order-2"}, charge{"order-2", 990})

	fmt.Println(e.Work(ctx, t, c, charges.Name, "order-2").Outcome) // retried, due again after a backoff
	res := e.WorkLastAttempt(ctx, t, c, charges.Name, "order-2")    // at once, as its last attempt
	fmt.Println(res.Outcome, refunded)                              // dead [order-2]
}
