// Command shop is issue 30's comparison service written against delayq: it
// charges an order 30 minutes after checkout exactly once, expires a reservation
// unless it is confirmed, and mails a daily digest at 08:00 Europe/Berlin.
// ../river is the same service written against River v0.51. Shop's methods are
// the service's API, for a transport (HTTP, say, the same in both and left out)
// to call.
//
//	DATABASE_URL=postgres://... REDIS_URL=redis://... shop
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
	"github.com/delayq/delayq/schedule"
)

const chargeDelay = 30 * time.Minute

// The ledger has no unique constraint on purpose: a charge applied twice would
// be a second row.
const tables = `
CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, amount_cents int NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (order_id text NOT NULL, amount_cents int NOT NULL, charged_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS reservations (id text PRIMARY KEY, status text NOT NULL DEFAULT 'held', expires_at timestamptz NOT NULL)`

// Mailer sends the digest.
type Mailer interface {
	Send(ctx context.Context, subject, body string) error
}

// The shop's queues, shared by producers and handlers. A task's id is its
// order's or reservation's, which makes a charge unique by order.
var (
	charges     = outbox.Queue[Charge]{Name: "charge"}
	expirations = outbox.Queue[struct{}]{Name: "expire-reservation"}
	digests     = outbox.Queue[struct{}]{Name: "daily-digest"}
)

type Charge struct{ AmountCents int }

// digestSchedule is 08:00 on Berlin's wall clock, summer and winter.
var digestSchedule = schedule.Schedule{Name: "daily-digest", Queue: digests.Name, Cron: "0 8 * * *", TimeZone: "Europe/Berlin"}

// register adds the shop's handlers to client, and the digest's schedule beside
// its handler (typed: its ticks carry the queue's struct{}). Each handler runs in
// the transaction that records its task done.
func register(client *delayq.Client, mailer Mailer) error {
	digest, err := schedule.For(digests, struct{}{}, digestSchedule)
	return errors.Join(err, client.Schedule(digest),
		// The ledger row commits with the task's completion, so the charge is
		// recorded once however often the task runs.
		delayq.RegisterTx(client, charges, func(ctx context.Context, tx pgx.Tx, t *delayq.Task, c Charge) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, amount_cents) VALUES ($1, $2)`, t.ID, c.AmountCents)
			return err
		}, delayq.QueueConfig{}),
		delayq.RegisterTx(client, expirations, func(ctx context.Context, tx pgx.Tx, t *delayq.Task, _ struct{}) error {
			_, err := tx.Exec(ctx, `UPDATE reservations SET status = 'expired' WHERE id = $1 AND status = 'held'`, t.ID)
			return err
		}, delayq.QueueConfig{}),
		// The digest covers the day before its tick.
		delayq.RegisterTx(client, digests, func(ctx context.Context, tx pgx.Tx, t *delayq.Task, _ struct{}) error {
			_, tick, _ := schedule.ParseTaskID(t.ID)
			return sendDigest(ctx, tx, mailer, tick)
		}, delayq.QueueConfig{}),
	)
}

func sendDigest(ctx context.Context, tx pgx.Tx, mailer Mailer, until time.Time) error {
	var n, cents int
	err := tx.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount_cents), 0) FROM ledger WHERE charged_at >= $1 AND charged_at < $2`,
		until.Add(-24*time.Hour), until).Scan(&n, &cents)
	if err != nil {
		return err
	}
	return mailer.Send(ctx, "Daily digest "+until.Format(time.DateOnly), fmt.Sprintf("%d charges, %d cents", n, cents))
}

// Shop is the service's API: each call writes in the caller's transaction.
type Shop struct{ jobs outbox.Producer }

// Checkout records the order and its charge, due in 30 minutes.
func (s Shop) Checkout(ctx context.Context, tx pgx.Tx, orderID string, amountCents int) error {
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, amount_cents) VALUES ($1, $2) ON CONFLICT DO NOTHING`, orderID, amountCents); err != nil {
		return err
	}
	_, err := charges.Enqueue(ctx, s.jobs, tx, outbox.Task{ID: orderID, Delay: chargeDelay}, Charge{AmountCents: amountCents})
	return err
}

// Reserve holds a reservation until ttl has passed, unless Confirm comes first.
func (s Shop) Reserve(ctx context.Context, tx pgx.Tx, id string, ttl time.Duration) error {
	expiresAt := time.Now().Add(ttl)
	if _, err := tx.Exec(ctx, `INSERT INTO reservations (id, expires_at) VALUES ($1, $2)`, id, expiresAt); err != nil {
		return err
	}
	_, err := expirations.Enqueue(ctx, s.jobs, tx, outbox.Task{ID: id, RunAt: expiresAt}, struct{}{})
	return err
}

// Confirm keeps a held reservation; it reports false when it had expired.
func (s Shop) Confirm(ctx context.Context, tx pgx.Tx, id string) (bool, error) {
	tag, err := tx.Exec(ctx, `UPDATE reservations SET status = 'confirmed' WHERE id = $1 AND status = 'held'`, id)
	return tag.RowsAffected() == 1, err
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

// run works the shop's tasks, and relays them and the digest's ticks, in this
// process until a signal.
func run(ctx context.Context) error {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		return err
	}
	client, err := delayq.New(pool, redis.NewClient(opt), delayq.Config{Relay: &relay.Config{}})
	if err != nil {
		return err
	}
	if err := client.Migrate(ctx); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, tables); err != nil {
		return err
	}
	if err := register(client, logMailer{}); err != nil {
		return err
	}
	return client.Run(ctx)
}
