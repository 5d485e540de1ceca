// Command shop is issue 30's comparison service written against River v0.51: it
// charges an order 30 minutes after checkout exactly once, expires a reservation
// unless it is confirmed, and mails a daily digest at 08:00 Europe/Berlin.
// ../delayq is the same service written against delayq. Shop's methods are the
// service's API, for a transport (HTTP, say, the same in both and left out) to call.
//
//	DATABASE_URL=postgres://... shop
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/robfig/cron/v3"
)

const (
	chargeDelay = 30 * time.Minute
	// digestCron is 08:00 on Berlin's wall clock, summer and winter.
	digestCron = "CRON_TZ=Europe/Berlin 0 8 * * *"
)

// The ledger has no unique constraint on purpose: a charge applied twice would
// be a second row.
const tables = `
CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, amount_cents int NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (order_id text NOT NULL, amount_cents int NOT NULL, charged_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS reservations (id text PRIMARY KEY, status text NOT NULL DEFAULT 'held', expires_at timestamptz NOT NULL)`

// DB is what the workers need of Postgres: the pool, or a test's transaction.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Mailer sends the digest.
type Mailer interface {
	Send(ctx context.Context, subject, body string) error
}

type ChargeArgs struct {
	OrderID     string `json:"order_id" river:"unique"`
	AmountCents int    `json:"amount_cents"`
}

func (ChargeArgs) Kind() string { return "charge" }

// InsertOpts makes a charge unique by order: a retried checkout enqueues none.
func (ChargeArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

type ChargeWorker struct {
	river.WorkerDefaults[ChargeArgs]
	db DB
}

// Work writes the ledger row and completes the job in one transaction, so the
// charge is recorded once however often the job runs.
func (w *ChargeWorker) Work(ctx context.Context, job *river.Job[ChargeArgs]) error {
	tx, err := w.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, amount_cents) VALUES ($1, $2)`, job.Args.OrderID, job.Args.AmountCents); err != nil {
		return err
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

type ExpireReservationArgs struct {
	ReservationID string `json:"reservation_id"`
}

func (ExpireReservationArgs) Kind() string { return "expire_reservation" }

type ExpireReservationWorker struct {
	river.WorkerDefaults[ExpireReservationArgs]
	db DB
}

// Work expires the reservation unless it was confirmed meanwhile.
func (w *ExpireReservationWorker) Work(ctx context.Context, job *river.Job[ExpireReservationArgs]) error {
	_, err := w.db.Exec(ctx, `UPDATE reservations SET status = 'expired' WHERE id = $1 AND status = 'held'`, job.Args.ReservationID)
	return err
}

type DigestArgs struct{}

func (DigestArgs) Kind() string { return "daily_digest" }

type DigestWorker struct {
	river.WorkerDefaults[DigestArgs]
	db     DB
	mailer Mailer
}

// Work mails the charges of the day before the job's scheduled time.
func (w *DigestWorker) Work(ctx context.Context, job *river.Job[DigestArgs]) error {
	return sendDigest(ctx, w.db, w.mailer, job.ScheduledAt)
}

func sendDigest(ctx context.Context, db DB, mailer Mailer, until time.Time) error {
	var n, cents int
	err := db.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount_cents), 0) FROM ledger WHERE charged_at >= $1 AND charged_at < $2`,
		until.Add(-24*time.Hour), until).Scan(&n, &cents)
	if err != nil {
		return err
	}
	return mailer.Send(ctx, "Daily digest "+until.Format(time.DateOnly), fmt.Sprintf("%d charges, %d cents", n, cents))
}

// Shop is the service's API: each call writes in the caller's transaction.
type Shop struct{ jobs *river.Client[pgx.Tx] }

// Checkout records the order and its charge, due in 30 minutes.
func (s Shop) Checkout(ctx context.Context, tx pgx.Tx, orderID string, amountCents int) error {
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, amount_cents) VALUES ($1, $2) ON CONFLICT DO NOTHING`, orderID, amountCents); err != nil {
		return err
	}
	_, err := s.jobs.InsertTx(ctx, tx, ChargeArgs{OrderID: orderID, AmountCents: amountCents}, &river.InsertOpts{ScheduledAt: time.Now().Add(chargeDelay)})
	return err
}

// Reserve holds a reservation until ttl has passed, unless Confirm comes first.
func (s Shop) Reserve(ctx context.Context, tx pgx.Tx, id string, ttl time.Duration) error {
	expiresAt := time.Now().Add(ttl)
	if _, err := tx.Exec(ctx, `INSERT INTO reservations (id, expires_at) VALUES ($1, $2)`, id, expiresAt); err != nil {
		return err
	}
	_, err := s.jobs.InsertTx(ctx, tx, ExpireReservationArgs{ReservationID: id}, &river.InsertOpts{ScheduledAt: expiresAt})
	return err
}

// Confirm keeps a held reservation; it reports false when it had expired.
func (s Shop) Confirm(ctx context.Context, tx pgx.Tx, id string) (bool, error) {
	tag, err := tx.Exec(ctx, `UPDATE reservations SET status = 'confirmed' WHERE id = $1 AND status = 'held'`, id)
	return tag.RowsAffected() == 1, err
}

// newClient returns a River client that works the shop's jobs on db and
// enqueues the daily digest.
func newClient(pool *pgxpool.Pool, db DB, mailer Mailer) (*river.Client[pgx.Tx], error) {
	digestAt, err := cron.ParseStandard(digestCron)
	if err != nil {
		return nil, err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &ChargeWorker{db: db})
	river.AddWorker(workers, &ExpireReservationWorker{db: db})
	river.AddWorker(workers, &DigestWorker{db: db, mailer: mailer})
	return river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers: workers,
		PeriodicJobs: []*river.PeriodicJob{
			river.NewPeriodicJob(digestAt, func() (river.JobArgs, *river.InsertOpts) { return DigestArgs{}, nil }, &river.PeriodicJobOpts{ID: "daily_digest"}),
		},
	})
}

// migrate applies River's migrations, then creates the shop's tables.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, tables)
	return err
}

// logMailer stands in for a mail service.
type logMailer struct{}

func (logMailer) Send(ctx context.Context, subject, body string) error {
	slog.InfoContext(ctx, "mail", "subject", subject, "body", body)
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "shop:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrate(ctx, pool); err != nil {
		return err
	}
	client, err := newClient(pool, pool, logMailer{})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	<-client.Stopped() // a signal cancels ctx: River stops, cancelling running jobs
	return nil
}
