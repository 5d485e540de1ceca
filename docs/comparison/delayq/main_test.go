package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtest"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/schedule"
)

// TestMain stops the servers delayqtest starts when the environment names none.
func TestMain(m *testing.M) { delayqtest.Main(m) }

type testBundle struct {
	env    *delayqtest.Env
	client *delayq.Client
	shop   Shop
	mails  *mailbox
}

// setup gives the test a migrated database and a Redis prefix of its own, with
// the shop's tables and handlers.
func setup(t *testing.T) *testBundle {
	t.Helper()
	e := delayqtest.New(t, delayqtest.Options{})
	if _, err := e.Pool.Exec(context.Background(), tables); err != nil {
		t.Fatal(err)
	}
	b := &testBundle{env: e, client: e.Client(t, delayq.Config{}), mails: &mailbox{}}
	if err := register(b.client, b.mails); err != nil {
		t.Fatal(err)
	}
	b.shop = Shop{jobs: b.client}
	return b
}

// inTx runs f in a transaction and commits it.
func (b *testBundle) inTx(ctx context.Context, t *testing.T, f func(tx pgx.Tx) error) {
	t.Helper()
	if err := pgx.BeginFunc(ctx, b.env.Pool, f); err != nil {
		t.Fatal(err)
	}
}

// work runs the task now, through its handler.
func (b *testBundle) work(ctx context.Context, t *testing.T, queue, id string) {
	t.Helper()
	if res := b.env.Work(ctx, t, b.client, queue, id); res.Outcome != delayq.OutcomeSucceeded {
		t.Fatalf("%s/%s: %v %v", queue, id, res.Outcome, res.Err)
	}
}

func TestCheckoutChargesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	for range 2 { // a retried request
		b.inTx(ctx, t, func(tx pgx.Tx) error { return b.shop.Checkout(ctx, tx, "order-1", 1250) })
	}
	delayqtest.RequireEnqueued(ctx, t, b.env.Pool, delayqtest.Want{Queue: charges.Name, ID: "order-1",
		Payload: delayqtest.Equal(charges, Charge{AmountCents: 1250}), RunAt: time.Now().Add(chargeDelay), Within: time.Minute})

	b.work(ctx, t, charges.Name, "order-1")
	var rows int
	if err := b.env.Pool.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE order_id = 'order-1' AND amount_cents = 1250`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d ledger rows (%v)", rows, err)
	}
}

func TestReservationExpiresUnlessConfirmed(t *testing.T) {
	t.Parallel()
	for _, confirm := range []bool{false, true} {
		t.Run(fmt.Sprint("confirm=", confirm), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t)
			b.inTx(ctx, t, func(tx pgx.Tx) error { return b.shop.Reserve(ctx, tx, "seat-1", 15*time.Minute) })
			delayqtest.RequireEnqueued(ctx, t, b.env.Pool, delayqtest.Want{Queue: expirations.Name, ID: "seat-1", RunAt: time.Now().Add(15 * time.Minute), Within: time.Minute})
			if confirm {
				b.inTx(ctx, t, func(tx pgx.Tx) error {
					if ok, err := b.shop.Confirm(ctx, tx, "seat-1"); !ok || err != nil {
						t.Fatalf("confirm: %v, %v", ok, err)
					}
					return nil
				})
			}

			b.work(ctx, t, expirations.Name, "seat-1")
			want := map[bool]string{false: "expired", true: "confirmed"}[confirm]
			var status string
			if err := b.env.Pool.QueryRow(ctx, `SELECT status FROM reservations WHERE id = 'seat-1'`).Scan(&status); err != nil || status != want {
				t.Fatalf("status %q (%v), want %q", status, err, want)
			}
		})
	}
}

func TestDailyDigest(t *testing.T) {
	t.Parallel()
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	// 08:00 in Berlin, in winter (UTC+1) and in summer (UTC+2).
	for after, want := range map[time.Time]time.Time{
		time.Date(2026, 3, 28, 9, 0, 0, 0, berlin): time.Date(2026, 3, 29, 6, 0, 0, 0, time.UTC),
		time.Date(2026, 1, 10, 7, 0, 0, 0, berlin): time.Date(2026, 1, 10, 7, 0, 0, 0, time.UTC),
	} {
		if got, err := schedule.Next(digestSchedule, after); err != nil || !got.Equal(want) {
			t.Errorf("after %v: next digest at %v (%v), want %v", after, got, err, want)
		}
	}

	ctx := context.Background()
	b := setup(t)
	tick := time.Date(2026, 1, 10, 8, 0, 0, 0, berlin)
	id := schedule.TaskID(digestSchedule, tick)
	b.inTx(ctx, t, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, amount_cents, charged_at) VALUES ('a', 100, $1), ('b', 200, $2), ('c', 400, $3)`,
			tick.Add(-time.Hour), tick.Add(-23*time.Hour), tick.Add(-25*time.Hour))
		if err != nil {
			return err
		}
		_, err = digests.Enqueue(ctx, b.client, tx, outbox.Task{ID: id}, struct{}{})
		return err
	})
	b.work(ctx, t, digests.Name, id)
	if want := "Daily digest 2026-01-10: 2 charges, 300 cents"; len(b.mails.sent) != 1 || b.mails.sent[0] != want {
		t.Fatalf("mails %q, want %q", b.mails.sent, want)
	}
}

// mailbox is a Mailer that keeps what it sends.
type mailbox struct{ sent []string }

func (m *mailbox) Send(_ context.Context, subject, body string) error {
	m.sent = append(m.sent, subject+": "+body)
	return nil
}
