package reconcile_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/reconcile"
)

// Rebuild Redis from the outbox after Redis lost data: first look, then repair.
func ExampleReconcile() {
	ctx := context.Background()
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

	look, err := reconcile.Reconcile(ctx, pool, dq, reconcile.Options{DryRun: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d inconsistencies, %d missing from Redis\n", look.Found, look.Kinds[reconcile.MissingInRedis].Found)

	rep, err := reconcile.Reconcile(ctx, pool, dq, reconcile.Options{
		Progress: func(p reconcile.Progress) { log.Printf("%s: %s %d/%d", p.Queue, p.Phase, p.Done, p.Total) },
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("repaired %d, skipped %d (run again for those)\n", rep.Repaired, rep.Skipped)
}

// A pre-launch gate: list every inconsistency, fail if there is one.
func ExampleCheck() {
	ctx := context.Background()
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

	incs, err := reconcile.Check(ctx, pool, dq, reconcile.Options{Queues: []string{"payment"}})
	if err != nil {
		log.Fatal(err)
	}
	for _, inc := range incs {
		fmt.Printf("%s %s/%s: postgres %s, redis %s\n", inc.Kind, inc.Queue, inc.ID, inc.Postgres, inc.Redis)
	}
	if len(incs) > 0 {
		os.Exit(1)
	}
}
