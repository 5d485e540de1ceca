package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtest"
)

// TestMain stops the servers delayqtest starts from local binaries when
// DELAYQ_TEST_POSTGRES_URL and DELAYQ_TEST_REDIS_URL name none. These tests
// use public packages only: copy them into a module of your own.
func TestMain(m *testing.M) { delayqtest.Main(m) }

func newEnv(t *testing.T) (*delayqtest.Env, *delayq.Client) {
	e := delayqtest.New(t, delayqtest.Options{})
	c := e.Client(t, delayq.Config{})
	if err := setup(context.Background(), c, e.Pool); err != nil {
		t.Fatal(err)
	}
	if err := register(c, 1); err != nil {
		t.Fatal(err)
	}
	return e, c
}

// An order enqueues its charge in its own transaction, once; the charge writes
// one ledger row, and a second delivery is refused.
func TestChargeOnce(t *testing.T) {
	t.Parallel()
	e, c := newEnv(t)
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		if dup, err := placeOrder(ctx, c, tx, "order-1", 1250, time.Hour); err != nil || dup {
			t.Fatalf("placeOrder: duplicate %v, %v", dup, err)
		}
		delayqtest.RequireEnqueued(ctx, t, tx, delayqtest.Want{Queue: charges.Name, ID: "order-1",
			Payload: delayqtest.Equal(charges, Charge{AmountCents: 1250}), RunAt: time.Now().Add(time.Hour), Within: time.Minute})
		dup, err := placeOrder(ctx, c, tx, "order-1", 1250, time.Hour)
		if !dup {
			t.Error("the second placeOrder was not a duplicate")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if res := e.Work(ctx, t, c, charges.Name, "order-1"); res.Outcome != delayq.OutcomeSucceeded {
		t.Fatalf("charge: %+v", res)
	}
	var rows int
	if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM payment_ledger WHERE order_id = 'order-1' AND amount_cents = 1250`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d ledger rows (%v)", rows, err)
	}
}

// A declined charge dies at once and its order is payment_failed, with no ledger
// row; an order whose transaction rolled back enqueued nothing.
func TestDeclinedCharge(t *testing.T) {
	t.Parallel()
	e, c := newEnv(t)
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		_, err := placeOrder(ctx, c, tx, "order-0", 0, 0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if res := e.Work(ctx, t, c, charges.Name, "order-0"); res.Outcome != delayq.OutcomeDead || res.Err == nil {
		t.Fatalf("declined charge: %+v", res)
	}
	var status string
	var rows int
	if err := e.Pool.QueryRow(ctx, `SELECT status, (SELECT count(*) FROM payment_ledger) FROM orders WHERE id = 'order-0'`).Scan(&status, &rows); err != nil {
		t.Fatal(err)
	}
	if status != "payment_failed" || rows != 0 {
		t.Errorf("order status %q, %d ledger rows", status, rows)
	}

	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := placeOrder(ctx, c, tx, "order-2", 10, 0); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	delayqtest.RequireNotEnqueued(ctx, t, e.Pool, delayqtest.Want{Queue: charges.Name, ID: "order-2"})
}
