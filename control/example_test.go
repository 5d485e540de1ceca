package control_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/control"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/outbox"
)

// Pause a queue, limit it, and resume it: each call commits in PostgreSQL and then
// writes Redis's copy, which every worker's claim reads.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	dq, err := dispatch.New(redis.NewClient(&redis.Options{Addr: "localhost:6379"}), dispatch.Config{})
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	queues, err := control.New(pool, ob, dq) // the pool, not a transaction
	if err != nil {
		log.Fatal(err)
	}
	if _, err := queues.Pause(ctx, "payment"); errors.Is(err, control.ErrNotMirrored) {
		log.Print(err) // paused in PostgreSQL; the relay writes Redis within seconds
	} else if err != nil {
		log.Fatal(err)
	}
	if _, err := queues.SetRateLimit(ctx, "payment", control.RateLimit{Limit: 100, Period: time.Second}); err != nil {
		log.Print(err)
	}
	if _, err := queues.Resume(ctx, "payment"); err != nil {
		log.Print(err)
	}
}
