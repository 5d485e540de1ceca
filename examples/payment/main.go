// Command payment is the seed's scenario as a program you can copy from: an order
// transaction enqueues "charge order-N later" in the same transaction, and a worker
// charges it with a transactional handler that writes one ledger row, so the charge
// is applied exactly once however often the task is delivered.
//
//	payment enqueue --count 100 --delay 5s    # orders and their tasks, in one transaction each
//	delayq relay                              # the sidecar: outbox -> Redis (or run it in-process)
//	payment worker --concurrency 16           # charges due orders
//	payment report                            # orders, charges, duplicates (must be 0)
//
// DATABASE_URL and REDIS_URL come from the environment. Kill and restart any of
// these processes as you like: the ledger never gets a second row for one order.
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
	"github.com/delayq/delayq/delayq/worker"
	"github.com/delayq/delayq/migrations"
	"github.com/delayq/delayq/outbox"
)

const queue = "payment"

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
	if err := setup(ctx, pool); err != nil {
		return err
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		return err
	}
	switch args[0] {
	case "enqueue":
		return enqueue(ctx, pool, ob, *start, *count, *delay)
	case "worker":
		return work(ctx, pool, ob, *concurrency)
	case "report":
		return report(ctx, pool)
	}
	return fmt.Errorf("unknown command %q: want enqueue, worker or report", args[0])
}

// setup applies the delayq migrations and creates the business tables. The ledger
// has no unique constraint on order_id on purpose: a charge applied twice would be
// a second row that anyone counting rows can see.
func setup(ctx context.Context, pool *pgxpool.Pool) error {
	db := migrations.OpenDBFromPool(pool)
	defer db.Close()
	if _, err := migrations.Up(ctx, db, migrations.Config{}); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, amount_cents int NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
		CREATE TABLE IF NOT EXISTS payment_ledger (order_id text NOT NULL, amount_cents int NOT NULL, charged_at timestamptz NOT NULL DEFAULT now())`)
	return err
}

// enqueue creates orders; each order and its charge task commit together. It then
// enqueues every task a second time, as a retried HTTP request would, to show the
// duplicates refused.
func enqueue(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Client, start, count int, delay time.Duration) error {
	added, dups := 0, 0
	for i := start; i < start+count; i++ {
		id := fmt.Sprintf("order-%d", i)
		payload, err := outbox.JSON(map[string]any{"order_id": id, "amount_cents": 1000 + i%100})
		if err != nil {
			return err
		}
		task := outbox.Task{Queue: queue, ID: id, Payload: payload, Delay: delay}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO orders (id, amount_cents) VALUES ($1, $2) ON CONFLICT DO NOTHING`, id, 1000+i%100); err != nil {
				return err
			}
			res, err := ob.Enqueue(ctx, tx, task)
			if err == nil && res.Duplicate {
				dups++
			} else if err == nil {
				added++
			}
			return err
		})
		if err != nil {
			return err
		}
		// The same request again: refused, and the transaction goes on normally.
		if res, err := ob.Enqueue(ctx, pool, task); err != nil {
			return err
		} else if res.Duplicate {
			dups++
		}
	}
	fmt.Printf("enqueued %d charges, refused %d duplicates\n", added, dups)
	return nil
}

// work runs the charge handler until interrupted.
func work(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Client, concurrency int) error {
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	dq, err := delayq.New(rdb, delayq.Config{})
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	w, err := worker.New(pool, dq, ob, worker.Config{Logger: log})
	if err != nil {
		return err
	}
	charge := func(ctx context.Context, tx pgx.Tx, t *worker.Task) error {
		// The ledger row and the task's completion commit together: exactly once.
		_, err := tx.Exec(ctx, `INSERT INTO payment_ledger (order_id, amount_cents)
			SELECT id, amount_cents FROM orders WHERE id = $1`, t.ID)
		return err
	}
	if err := w.HandleTx(queue, charge, worker.QueueConfig{Concurrency: concurrency}); err != nil {
		return err
	}
	fmt.Println("worker running; Ctrl-C to stop")
	return w.Run(ctx)
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
