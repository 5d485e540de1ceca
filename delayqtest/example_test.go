package delayqtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtest"
	"github.com/delayq/delayq/outbox"
)

// placeOrder is the application code under test: the order and its charge
// commit together.
func placeOrder(ctx context.Context, ob *outbox.Client, tx pgx.Tx, id string, cents int) error {
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, cents) VALUES ($1, $2)`, id, cents); err != nil {
		return err
	}
	_, err := charges.Enqueue(ctx, ob, tx, outbox.Task{ID: id, Delay: 30 * time.Minute}, charge{id, cents})
	return err
}

// A test of one's own code: what placeOrder enqueued, then the charge handler
// run at once through a real worker. (It runs as a test, with t; servers from
// DELAYQ_TEST_POSTGRES_URL and DELAYQ_TEST_REDIS_URL.)
func Example() {
	var t *testing.T // the test's
	ctx := context.Background()
	e := delayqtest.New(t, delayqtest.Options{})
	_, _ = e.Pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, cents int, paid bool DEFAULT false)`)

	err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		if err := placeOrder(ctx, e.Outbox, tx, "order-1", 1250); err != nil {
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

	c := e.Client(t, delayq.Config{})
	_ = delayq.RegisterTx(c, charges, func(ctx context.Context, tx pgx.Tx, _ *delayq.Task, c charge) error {
		_, err := tx.Exec(ctx, `UPDATE orders SET paid = true WHERE id = $1`, c.Order)
		return err
	}, delayq.QueueConfig{})
	res := e.Work(ctx, t, c, charges.Name, "order-1") // now, not in 30 minutes
	if res.Outcome != delayq.OutcomeSucceeded {
		t.Fatalf("charge: %v %v", res.Outcome, res.Err)
	}
}
