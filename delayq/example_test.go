package delayq_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/outbox"
)

// A worker with a transactional handler (the payment row and the task's completion
// commit together: charged exactly once) and a plain one (an HTTP call, at least
// once, deduplicated by the receiver through the idempotency key). It runs until
// interrupted, then shuts down gracefully.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
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
	dq, err := dispatch.New(redis.NewClient(opt), dispatch.Config{})
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}

	w, err := delayq.NewWorker(pool, dq, ob, delayq.WorkerConfig{Lease: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	err = w.HandleTx("payment", func(ctx context.Context, tx pgx.Tx, t *delayq.Task) error {
		tag, err := tx.Exec(ctx, `UPDATE orders SET paid = true WHERE id = $1 AND NOT paid`, t.ID)
		if err != nil {
			return err // rolled back; retried after the queue's backoff
		}
		if tag.RowsAffected() == 0 {
			return delayq.NoRetry(errors.New("no unpaid order " + t.ID)) // dead at once
		}
		return nil
	}, delayq.QueueConfig{Concurrency: 20, MaxAttempts: 10})
	if err != nil {
		log.Fatal(err)
	}
	err = w.Handle("webhook", func(ctx context.Context, t *delayq.Task) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://example.com/hook", nil)
		if err != nil {
			return delayq.NoRetry(err)
		}
		req.Header.Set("Idempotency-Key", t.IdempotencyKey())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			return delayq.RetryAfter(30*time.Second, errors.New(resp.Status))
		}
		if resp.StatusCode >= 300 {
			return errors.New(resp.Status)
		}
		return nil
	}, delayq.QueueConfig{Backoff: delayq.Backoff{Base: 5 * time.Second, Max: 10 * time.Minute}})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Charge is the payload of the typed queue Charges.
type Charge struct {
	Order       string
	AmountCents int
}

// Charges is declared once and shared by producers (Charges.Enqueue) and workers.
var Charges = outbox.Queue[Charge]{Name: "charge"}

// A typed transactional handler with an OnDead hook: the charge commits with the
// task's completion, and a charge that dies marks its order in the transaction
// that records the death. Each happens exactly once.
func ExampleRegisterTx() {
	var w *delayq.Worker // worker.New(pool, dq, ob, worker.Config{})
	err := delayq.RegisterTx(w, Charges, func(ctx context.Context, tx pgx.Tx, t *delayq.Task, c Charge) error {
		if c.AmountCents <= 0 {
			return delayq.NoRetry(errors.New("nothing to charge")) // dead at once
		}
		_, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, cents) VALUES ($1, $2)`, c.Order, c.AmountCents)
		return err
	}, delayq.QueueConfig{
		OnDead: func(ctx context.Context, tx pgx.Tx, t *delayq.Task, cause error) error {
			_, err := tx.Exec(ctx, `UPDATE orders SET status = 'payment_failed' WHERE id = $1`, t.ID)
			return err
		},
		Retry: func(attempt int, err error) (time.Duration, bool) {
			return time.Duration(attempt) * time.Minute, attempt < 5
		},
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A middleware of one's own beside the built-ins: every run of every queue is
// logged and bounded to a minute; the queue "report" snoozes outside office hours
// (the attempt is not counted).
func ExampleMiddleware() {
	officeHours := func(ctx context.Context, t *delayq.Task, next delayq.Next) error {
		if t.Queue == "report" && time.Now().Hour() < 8 {
			return delayq.Snooze(time.Hour)
		}
		return next(ctx)
	}
	cfg := delayq.WorkerConfig{Middleware: []delayq.Middleware{
		delayq.Logging(slog.Default()), delayq.Timeout(time.Minute), officeHours,
	}}
	fmt.Println(cfg.Validate())
	// Output: <nil>
}

// Group commit for a queue of short transactional handlers: up to 32 tasks share a
// transaction (a commit, one disk flush, for all of them), each in a savepoint of
// its own, so a failing one is retried alone. 128 slots make four groups at once,
// each on a connection of the pool.
func ExampleGroupCommit() {
	cfg := delayq.QueueConfig{
		Concurrency: 128,
		GroupCommit: delayq.GroupCommit{MaxTasks: 32, MaxWait: 2 * time.Millisecond},
	}
	fmt.Println(cfg.Validate())
	// Output: <nil>
}
