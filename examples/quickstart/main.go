package main

import (
	"context"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

type Charge struct{ AmountCents int }

// Charges names a queue and its payload type; producers and handlers share it.
var Charges = outbox.Queue[Charge]{Name: "payment"}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})

	// One client: the relay runs in this process too (nil Relay: run `delayq relay` beside it).
	client, err := delayq.New(pool, rdb, delayq.Config{Relay: &relay.Config{}})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Migrate(ctx); err != nil { // the outbox table, in Config.Schema ("public")
		log.Fatal(err)
	}

	// The handler's writes commit together with the task's completion: exactly once.
	err = delayq.RegisterTx(client, Charges, func(ctx context.Context, tx pgx.Tx, t *delayq.Task, c Charge) error {
		_, err := tx.Exec(ctx, `INSERT INTO payment_ledger (order_id, amount_cents) VALUES ($1, $2)`, t.ID, c.AmountCents)
		return err // nil: committed with the completion; an error: rolled back, retried with backoff
	}, delayq.QueueConfig{Concurrency: 16})
	if err != nil {
		log.Fatal(err)
	}

	// Checkout: the task exists if and only if the order's transaction commits.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, amount_cents) VALUES ('order-1001', 4200)`); err != nil {
			return err
		}
		_, err := Charges.Enqueue(ctx, client, tx, outbox.Task{ID: "order-1001", Delay: 30 * time.Minute}, Charge{4200})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	// Workers and relay until Ctrl-C; then in-flight handlers finish, the rest are handed back.
	if err := client.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
