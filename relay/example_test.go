package relay_test

import (
	"context"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/relay"
)

// A relay process: the outbox database, Redis, and Run until SIGTERM. (It needs
// servers, so it is compiled but not run; `delayq relay` does the same, with an
// admin server for /metrics, /healthz and /readyz.)
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	dq, err := dispatch.New(rdb, dispatch.Config{})
	if err != nil {
		log.Fatal(err)
	}

	rl, err := relay.New(pool, dq.AsRedis(), relay.Config{
		Logger:     slog.Default(),
		Registerer: prometheus.DefaultRegisterer,
	})
	if err != nil {
		log.Fatal(err)
	}
	// Returns nil after SIGTERM, once the round in hand is committed; at once
	// with outbox.ErrNotMigrated when the migrations have not run.
	if err := rl.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
