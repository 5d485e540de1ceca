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
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// The whole flow on one client: migrate, register a transactional handler (the
// ledger row and the task's completion commit together: charged exactly once),
// enqueue in the business transaction (the task exists if and only if it
// commits), and run the workers with the relay in the same process until
// interrupted, then shut down gracefully.
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

	client, err := delayq.New(pool, redis.NewClient(opt), delayq.Config{Relay: &relay.Config{}})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	err = delayq.RegisterTx(client, Charges, func(ctx context.Context, tx pgx.Tx, t *delayq.Task, c Charge) error {
		_, err := tx.Exec(ctx, `INSERT INTO ledger (order_id, cents) VALUES ($1, $2)`, c.Order, c.AmountCents)
		return err // nil: committed with the completion; an error: rolled back, retried
	}, delayq.QueueConfig{Concurrency: 16})
	if err != nil {
		log.Fatal(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ('order-1')`); err != nil {
			return err
		}
		_, err := Charges.Enqueue(ctx, client, tx, outbox.Task{ID: "order-1", Delay: 30 * time.Minute},
			Charge{Order: "order-1", AmountCents: 4200})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// A plain handler, for an effect outside PostgreSQL (an HTTP call): at least
// once, deduplicated by the receiver through the task's idempotency key.
func ExampleRegister() {
	var client *delayq.Client // delayq.New(pool, rdb, delayq.Config{})
	err := delayq.Register(client, Webhooks, func(ctx context.Context, t *delayq.Task, url string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
		if err != nil {
			return delayq.NoRetry(err) // dead at once
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
}

// Webhooks is a typed queue whose payload is the URL to call.
var Webhooks = outbox.Queue[string]{Name: "webhook"}

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
	var client *delayq.Client // delayq.New(pool, rdb, delayq.Config{})
	err := delayq.RegisterTx(client, Charges, func(ctx context.Context, tx pgx.Tx, t *delayq.Task, c Charge) error {
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

// New checks the configuration and connects to nothing, so a bad one is
// refused at once, and a good one shows its defaults. The schema, the key
// prefix and the channel are named once: a nested configuration that names
// others is refused.
func ExampleNew() {
	pool, err := pgxpool.New(context.Background(), "postgres://localhost/app") // connects at first use
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"}) // connects at first use
	defer rdb.Close()

	_, err = delayq.New(pool, rdb, delayq.Config{Schema: "Not-A-Schema"})
	fmt.Println(errors.Is(err, delayq.ErrInvalidConfig))
	_, err = delayq.New(pool, rdb, delayq.Config{Schema: "shop", Relay: &relay.Config{Schema: "other"}})
	fmt.Println(errors.Is(err, delayq.ErrInvalidConfig))
	client, err := delayq.New(pool, rdb, delayq.Config{Schema: "shop"})
	if err != nil {
		log.Fatal(err)
	}
	cfg := client.Config()
	fmt.Println(cfg.Schema, cfg.Prefix, cfg.NotifyChannel, cfg.Worker.Lease)
	// Output:
	// true
	// true
	// shop dq delayq_outbox 5s
}
