// Command httpapi is an HTTP service whose request handler enqueues a delayed task
// inside its own database/sql transaction, with a worker beside it.
//
//	POST /signup?email=a@example.com   creates a user and, in the same transaction,
//	                                   schedules a welcome email for later
//	GET  /healthz                      ok
//
// The email is an effect outside Postgres, so it uses a plain handler: it runs at
// least once, and the task's IdempotencyKey is what the mail provider would get to
// drop repeats. For the sake of one runnable program the relay runs in-process
// here; in production run it as the `delayq relay` sidecar.
//
// DATABASE_URL and REDIS_URL come from the environment.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"encoding/json"
	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/migrations"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

const queue = "welcome-email"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "httpapi:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("httpapi", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8080", "HTTP listen address")
	delay := fs.Duration("delay", 10*time.Second, "how long after signup the welcome email goes out")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	db := migrations.OpenDBFromPool(pool) // database/sql over the same connections
	defer db.Close()
	if _, err := migrations.Up(ctx, db, migrations.Config{}); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS users (email text PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now());
		CREATE TABLE IF NOT EXISTS sent_emails (email text NOT NULL, idempotency_key text NOT NULL, sent_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		return err
	}
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	dq, err := dispatch.New(rdb, dispatch.Config{})
	if err != nil {
		return err
	}
	rl, err := relay.New(pool, dq.AsRedis(), relay.Config{Logger: log})
	if err != nil {
		return err
	}
	w, err := clientkit.NewClient(pool, dq, ob, delayq.WorkerConfig{Logger: log})
	if err != nil {
		return err
	}
	if err := w.Handle(queue, sendWelcome(pool, log), delayq.QueueConfig{Concurrency: 4}); err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /signup", signup(db, ob, *delay))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	var wg sync.WaitGroup
	errs := make(chan error, 3)
	wg.Go(func() { errs <- rl.Run(ctx) })
	wg.Go(func() { errs <- w.Run(ctx) })
	wg.Go(func() {
		if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			errs <- err
		}
	})
	log.Info("httpapi: listening", "addr", *listen)
	select {
	case <-ctx.Done():
	case err := <-errs:
		log.Error("httpapi: stopping", "err", err)
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	wg.Wait()
	return nil
}

// signup creates the user and schedules the welcome email in one database/sql
// transaction: if the user insert fails, no email is ever sent.
func signup(db *sql.DB, ob *outbox.Client, delay time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		email := r.URL.Query().Get("email")
		if email == "" {
			http.Error(w, "email is required", http.StatusBadRequest)
			return
		}
		tx, err := db.BeginTx(r.Context(), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback() //nolint:errcheck // a no-op after Commit
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO users (email) VALUES ($1)`, email); err != nil {
			http.Error(w, "user exists or cannot be created", http.StatusConflict)
			return
		}
		payload, _ := json.Marshal(map[string]string{"email": email})
		_, err = ob.EnqueueSQL(r.Context(), tx, outbox.Task{Queue: queue, ID: "welcome:" + email, Payload: payload, Delay: delay})
		if errors.Is(err, outbox.ErrInvalidTaskID) {
			http.Error(w, "email cannot be used as a task id: "+err.Error(), http.StatusBadRequest)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := tx.Commit(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "welcome email scheduled in %v\n", delay)
	}
}

// sendWelcome stands in for a mail provider call. It records the send with the
// task's idempotency key, as a provider would use it to drop repeated requests.
func sendWelcome(pool *pgxpool.Pool, log *slog.Logger) func(context.Context, *delayq.Task) error {
	return func(ctx context.Context, t *delayq.Task) error {
		_, err := pool.Exec(ctx, `INSERT INTO sent_emails (email, idempotency_key) VALUES ($1::jsonb->>'email', $2)`,
			string(t.Payload), t.IdempotencyKey())
		if err == nil {
			log.Info("httpapi: welcome email sent", "task", t.ID, "idempotency_key", t.IdempotencyKey())
		}
		return err
	}
}
