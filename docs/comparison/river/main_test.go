package main

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertest"
	"github.com/robfig/cron/v3"
)

var testPool *pgxpool.Pool

// TestMain migrates the database TEST_DATABASE_URL names, once; each test then
// works in a transaction of its own that is rolled back when it ends.
func TestMain(m *testing.M) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("TEST_DATABASE_URL"))
	if err == nil {
		err = migrate(ctx, pool)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "migrate the test database:", err)
		os.Exit(1)
	}
	testPool = pool
	os.Exit(m.Run())
}

type testBundle struct {
	tx   pgx.Tx
	shop Shop
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	tx, err := testPool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	// Without a pool the client only inserts, in the transaction it is given.
	jobs, err := river.NewClient(riverpgxv5.New(nil), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{tx: tx, shop: Shop{jobs: jobs}}
}

// work runs job through worker now, in the test's transaction.
func work[T river.JobArgs](ctx context.Context, t *testing.T, tx pgx.Tx, worker river.Worker[T], job *river.Job[T]) {
	t.Helper()
	res, err := rivertest.NewWorker(t, riverpgxv5.New(nil), &river.Config{}, worker).WorkJob(ctx, t, tx, job.JobRow)
	if err != nil {
		t.Fatal(err)
	}
	if res.EventKind != river.EventKindJobCompleted {
		t.Fatalf("job %s: %s", job.Kind, res.EventKind)
	}
}

func TestCheckoutChargesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	for range 2 { // a retried request
		if err := b.shop.Checkout(ctx, b.tx, "order-1", 1250); err != nil {
			t.Fatal(err)
		}
	}
	job := rivertest.RequireInsertedTx[*riverpgxv5.Driver](ctx, t, b.tx, ChargeArgs{}, nil)
	if job.Args != (ChargeArgs{OrderID: "order-1", AmountCents: 1250}) {
		t.Errorf("charge %+v", job.Args)
	}
	if d := time.Until(job.ScheduledAt); d < chargeDelay-time.Minute || d > chargeDelay {
		t.Errorf("charge due in %v, want %v", d, chargeDelay)
	}

	work(ctx, t, b.tx, &ChargeWorker{db: b.tx}, job)
	var rows int
	if err := b.tx.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE order_id = 'order-1' AND amount_cents = 1250`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d ledger rows (%v)", rows, err)
	}
}

func TestReservationExpiresUnlessConfirmed(t *testing.T) {
	t.Parallel()
	for _, confirm := range []bool{false, true} {
		t.Run(fmt.Sprint("confirm=", confirm), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b, id := setup(t), fmt.Sprint("seat-", confirm)
			if err := b.shop.Reserve(ctx, b.tx, id, 15*time.Minute); err != nil {
				t.Fatal(err)
			}
			var expiresAt time.Time
			if err := b.tx.QueryRow(ctx, `SELECT expires_at FROM reservations WHERE id = $1`, id).Scan(&expiresAt); err != nil {
				t.Fatal(err)
			}
			job := rivertest.RequireInsertedTx[*riverpgxv5.Driver](ctx, t, b.tx, ExpireReservationArgs{}, &rivertest.RequireInsertedOpts{ScheduledAt: expiresAt})
			if job.Args.ReservationID != id {
				t.Errorf("expires %q", job.Args.ReservationID)
			}
			if confirm {
				if ok, err := b.shop.Confirm(ctx, b.tx, id); !ok || err != nil {
					t.Fatalf("confirm: %v, %v", ok, err)
				}
			}

			work(ctx, t, b.tx, &ExpireReservationWorker{db: b.tx}, job)
			want := map[bool]string{false: "expired", true: "confirmed"}[confirm]
			var status string
			if err := b.tx.QueryRow(ctx, `SELECT status FROM reservations WHERE id = $1`, id).Scan(&status); err != nil || status != want {
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
	schedule, err := cron.ParseStandard(digestCron)
	if err != nil {
		t.Fatal(err)
	}
	// 08:00 in Berlin, in winter (UTC+1) and in summer (UTC+2).
	for after, want := range map[time.Time]time.Time{
		time.Date(2026, 3, 28, 9, 0, 0, 0, berlin): time.Date(2026, 3, 29, 6, 0, 0, 0, time.UTC),
		time.Date(2026, 1, 10, 7, 0, 0, 0, berlin): time.Date(2026, 1, 10, 7, 0, 0, 0, time.UTC),
	} {
		if got := schedule.Next(after); !got.Equal(want) {
			t.Errorf("after %v: next digest at %v, want %v", after, got, want)
		}
	}

	ctx := context.Background()
	b := setup(t)
	tick := time.Date(2026, 1, 10, 8, 0, 0, 0, berlin)
	_, err = b.tx.Exec(ctx, `INSERT INTO ledger (order_id, amount_cents, charged_at) VALUES ('a', 100, $1), ('b', 200, $2), ('c', 400, $3)`,
		tick.Add(-time.Hour), tick.Add(-23*time.Hour), tick.Add(-25*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	mails := &mailbox{}
	res, err := rivertest.NewWorker(t, riverpgxv5.New(nil), &river.Config{}, &DigestWorker{db: b.tx, mailer: mails}).
		Work(ctx, t, b.tx, DigestArgs{}, &river.InsertOpts{ScheduledAt: tick})
	if err != nil || res.EventKind != river.EventKindJobCompleted {
		t.Fatalf("digest: %v, %v", res, err)
	}
	if want := "Daily digest 2026-01-10: 2 charges, 300 cents"; len(mails.sent) != 1 || mails.sent[0] != want {
		t.Fatalf("mails %q, want %q", mails.sent, want)
	}
}

// mailbox is a Mailer that keeps what it sends.
type mailbox struct{ sent []string }

func (m *mailbox) Send(_ context.Context, subject, body string) error {
	m.sent = append(m.sent, subject+": "+body)
	return nil
}
