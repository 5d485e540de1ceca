package dashboard_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/dashboard"
	"github.com/delayq/delayq/delayq"
)

// The dashboard in an application's own server, under /ops/delayq/, beside its
// other handlers. (It needs PostgreSQL and Redis, so it is compiled, not run.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	client, err := delayq.New(pool, rdb, delayq.Config{}) // the service's one client
	if err != nil {
		log.Fatal(err)
	}
	h, err := dashboard.New(client, dashboard.Config{
		Token:    os.Getenv("DELAYQ_UI_TOKEN"), // every action needs it, and a CSRF token
		BasePath: "/ops/delayq",
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/delayq/", h)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}

// Without credentials the dashboard serves actions to nobody: New refuses, unless
// it is read-only.
func ExampleNew_credentials() {
	rdb := redis.NewClient(&redis.Options{}) // connects at first use
	defer rdb.Close()
	pool, _ := pgxpool.New(context.Background(), "postgres://localhost/app") // connects at first use
	defer pool.Close()
	client, _ := delayq.New(pool, rdb, delayq.Config{})
	_, err := dashboard.New(client, dashboard.Config{})
	fmt.Println(errors.Is(err, dashboard.ErrInvalidConfig))
	_, err = dashboard.New(client, dashboard.Config{ReadOnly: true})
	fmt.Println(err)
	// Output:
	// true
	// <nil>
}

// One dashboard over a service's two outbox databases, each client named by its
// delayq.Config.Database key: the overview of both and their total at
// /ops/delayq/, each database's own dashboard at /ops/delayq/db/eu1/ and
// /ops/delayq/db/us1/. (It needs PostgreSQL and Redis, so it is compiled, not
// run.)
func ExampleNew_databases() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}) // one Redis for both
	defer rdb.Close()
	var clients []*delayq.Client
	for _, db := range []struct{ key, url string }{{"eu1", os.Getenv("EU1_DATABASE_URL")}, {"us1", os.Getenv("US1_DATABASE_URL")}} {
		pool, err := pgxpool.New(ctx, db.url)
		if err != nil {
			log.Fatal(err)
		}
		defer pool.Close()
		client, err := delayq.New(pool, rdb, delayq.Config{Database: db.key}) // its tasks under dq:eu1, dq:us1
		if err != nil {
			log.Fatal(err)
		}
		clients = append(clients, client)
	}
	h, err := dashboard.New(nil, dashboard.Config{
		Databases: clients,
		Token:     os.Getenv("DELAYQ_UI_TOKEN"), // one login for every database
		BasePath:  "/ops/delayq",
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/delayq/", h)
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}
