// Command payment is the seed's scenario as a program you can copy from: an order
// transaction enqueues "charge order-N later", and a worker charges it with a typed
// transactional handler that writes one ledger row: exactly once, however often the
// task is delivered. A charge that fails for good marks its order payment_failed
// in the transaction that records the task's death.
//
//	payment enqueue --count 100 --delay 5s    # orders and their tasks, in one transaction each
//	delayq relay                              # the sidecar: outbox -> Redis (or run it in-process)
//	payment worker --concurrency 16           # charges due orders
//	payment report                            # orders, charges, duplicates (must be 0)
//
// DATABASE_URL and REDIS_URL come from the environment. Kill and restart any of
// these processes as you like: the ledger never gets a second row for one order.
// main_test.go tests it with package delayqtest.
package main

import (
	"context"
	"errors"
	"flag"
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
)

// Charge is the payload of the queue charges, shared by producer and worker.
type Charge struct{ AmountCents int }

var charges = outbox.Queue[Charge]{Name: "payment"}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "payment:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: payment enqueue|worker|report [flags]")
	}
	fs := flag.NewFlagSet("payment "+args[0], flag.ContinueOnError)
	count := fs.Int("count", 100, "orders to create (enqueue)")
	start := fs.Int("start", 1, "number of the first order (enqueue)")
	delay := fs.Duration("delay", 2*time.Second, "how long after the order the charge runs (enqueue)")
	concurrency := fs.Int("concurrency", 16, "charges run at once (worker)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		return err
	}
	client, err := delayq.New(pool, redis.NewClient(opt), delayq.Config{
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	if err := setup(ctx, client, pool); err != nil {
		return err
	}
	switch args[0] {
	case "enqueue":
		return enqueue(ctx, pool, client, *start, *count, *delay)
	case "worker":
		return work(ctx, client, *concurrency)
	case "report":
		return report(ctx, pool)
	}
	return fmt.Errorf("unknown command %q: want enqueue, worker or report", args[0])
}

// setup applies the delayq migrations and creates the business tables. The ledger
// has no unique constraint on order_id on purpose: a charge applied twice would be
// a second row that anyone counting rows can see.
func setup(ctx context.Context, client *delayq.Client, pool *pgxpool.Pool) error {
	if err := client.Migrate(ctx); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, amount_cents int NOT NULL, status text NOT NULL DEFAULT 'new');
		CREATE TABLE IF NOT EXISTS payment_ledger (order_id text NOT NULL, amount_cents int NOT NULL, charged_at timestamptz NOT NULL DEFAULT now())`)
	return err
}

// placeOrder writes an order and its charge in tx; a second call is a duplicate.
func placeOrder(ctx context.Context, client *delayq.Client, tx pgx.Tx, id string, cents int, delay time.Duration) (duplicate bool, err error) {
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, amount_cents) VALUES ($1, $2) ON CONFLICT DO NOTHING`, id, cents); err != nil {
		return false, err
	}
	res, err := charges.Enqueue(ctx, client, tx, outbox.Task{ID: id, Delay: delay}, Charge{AmountCents: cents})
	return res.Duplicate, err
}

// enqueue places orders, each twice as a retried HTTP request would.
func enqueue(ctx context.Context, pool *pgxpool.Pool, client *delayq.Client, start, count int, delay time.Duration) error {
	n := map[bool]int{}
	for i := start * 2; i < (start+count)*2; i++ {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			dup, err := placeOrder(ctx, client, tx, fmt.Sprintf("order-%d", i/2), 1000+i/2%100, delay)
			n[dup]++
			return err
		}); err != nil {
			return err
		}
	}
	fmt.Printf("enqueued %d charges, refused %d duplicates\n", n[false], n[true])
	return nil
}

// register adds the charge handler: the ledger row commits with the task's
// completion. OnDead marks the order of a declined charge with its death.
func register(client *delayq.Client, concurrency int) error {
	return delayq.RegisterTx(client, charges, func(ctx context.Context, tx pgx.Tx, t *delayq.Task, c Charge) error {
		if c.AmountCents <= 0 {
			return delayq.NoRetry(errors.New("card declined"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO payment_ledger (order_id, amount_cents) VALUES ($1, $2)`, t.ID, c.AmountCents)
		return err
	}, delayq.QueueConfig{Concurrency: concurrency, OnDead: func(ctx context.Context, tx pgx.Tx, t *delayq.Task, _ error) error {
		_, err := tx.Exec(ctx, `UPDATE orders SET status = 'payment_failed' WHERE id = $1`, t.ID)
		return err
	}})
}

// work runs the charge handler until interrupted.
func work(ctx context.Context, client *delayq.Client, concurrency int) error {
	if err := register(client, concurrency); err != nil {
		return err
	}
	fmt.Println("worker running; Ctrl-C to stop")
	return client.Run(ctx)
}

func report(ctx context.Context, pool *pgxpool.Pool) error {
	var orders, charges, doubled int
	err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM payment_ledger),
		(SELECT count(*) FROM (SELECT order_id FROM payment_ledger GROUP BY order_id HAVING count(*) > 1) d)`).
		Scan(&orders, &charges, &doubled)
	if err != nil {
		return err
	}
	fmt.Printf("orders %d, charges %d, orders charged twice %d\n", orders, charges, doubled)
	return nil
}
