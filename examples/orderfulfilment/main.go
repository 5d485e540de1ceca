// Command orderfulfilment places orders whose fulfilment is a workflow: the
// stock is reserved and the card charged in parallel, the order ships once
// both succeeded, and it is refunded if either died.
//
//	orderfulfilment --orders 3                  # every order ships
//	orderfulfilment --orders 3 --fail charge    # every card is declined: every order is refunded
//	orderfulfilment --orders 3 --fail reserve   # out of stock: the charge is paid back
//
// DATABASE_URL and REDIS_URL come from the environment; the relay runs in this
// process. It places the orders, works until each one has shipped or been
// refunded, prints a report and exits.
//
// The four tasks of an order are enqueued in the transaction that places it,
// all with the order's id:
//
//   - reserve and charge: ordinary tasks, run at once, in parallel;
//   - ship: waits on both with the policy Fail: it runs once both are done,
//     and goes dead with the reason if either dies (it never runs then);
//   - refund: waits on both with the policy Run: it runs once both finished,
//     whatever their outcome, and undoes what succeeded.
//
// Why refund waits with Run: Fail and Skip settle the dependent without
// running it exactly when a dependency dies, the case where a refund is needed.
// An OnDead hook of charge could enqueue a refund in the death's transaction,
// but reserve may still be running or retrying then: the refund has to wait for
// it anyway, and one hook per queue would each have to find out what the other
// did. Waiting on both with Run releases the refund exactly once, in the
// transaction that finishes the last of the two (with that handler's writes),
// whatever the order of the outcomes. Its handler then reads the two states and
// stored results (final: both finished): both done, nothing to undo, and it
// cancels itself (delayq.Cancel: recorded with the reason, nothing written);
// otherwise it pays back a charge that went through, releases a reservation
// that was made, and marks the order refunded.
//
// Every handler writes its effect in its run's transaction, so it commits with
// the task's completion, exactly once, however often the task is delivered; a
// stored result (workflow.Client.SetResult) commits with it too. The tables of
// effects (reservations, charges, shipments, refunds) have no unique constraint
// on purpose: an effect written twice would be a second row the report counts.
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
	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
	"github.com/delayq/delayq/workflow"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "orderfulfilment:", err)
		os.Exit(1)
	}
}

// shop is the application: its client, its workflow client and which step the
// run makes fail for good.
type shop struct {
	pool   *pgxpool.Pool
	client *delayq.Client
	wf     *workflow.Client
	fail   string
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("orderfulfilment", flag.ContinueOnError)
	orders := fs.Int("orders", 3, "orders to place")
	fail := fs.String("fail", "", `the step that fails for good: "charge" (card declined) or "reserve" (out of stock); empty: none`)
	timeout := fs.Duration("timeout", time.Minute, "give up when the orders have not settled by then")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *fail != "" && *fail != "charge" && *fail != "reserve" {
		return fmt.Errorf("--fail %q: want charge, reserve or nothing", *fail)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		return err
	}
	runs := make(chan struct{}, 1)
	client, err := delayq.New(pool, redis.NewClient(opt), delayq.Config{
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Relay:  &relay.Config{},
		Worker: delayq.WorkerConfig{Observer: runEnds(runs)},
	})
	if err != nil {
		return err
	}
	s := &shop{pool: pool, client: client, wf: workflow.New(client), fail: *fail}
	if err := s.setup(ctx); err != nil {
		return err
	}
	if err := s.register(); err != nil {
		return err
	}
	ids := make([]string, *orders)
	for i := range ids {
		if ids[i], err = s.placeOrder(ctx, 1000+100*i); err != nil {
			return err
		}
	}

	work, stopWork := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- client.Run(work) }()
	err = s.waitSettled(ctx, ids, runs)
	stopWork()
	if rerr := <-ran; err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	return s.report(ctx, ids)
}

// setup applies delayq's migrations and creates the shop's tables.
func (s *shop) setup(ctx context.Context) error {
	if err := s.client.Migrate(ctx); err != nil {
		return err
	}
	_, err := s.pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS orders (n bigserial PRIMARY KEY, id text GENERATED ALWAYS AS ('order-' || n) STORED UNIQUE,
			amount_cents int NOT NULL, status text NOT NULL DEFAULT 'placed');
		CREATE TABLE IF NOT EXISTS reservations (n bigserial PRIMARY KEY, order_id text NOT NULL);
		CREATE TABLE IF NOT EXISTS charges (n bigserial PRIMARY KEY, order_id text NOT NULL, amount_cents int NOT NULL);
		CREATE TABLE IF NOT EXISTS shipments (order_id text NOT NULL, reservation text NOT NULL, charge text NOT NULL);
		CREATE TABLE IF NOT EXISTS refunds (order_id text NOT NULL, charge_refunded text, reservation_released text)`)
	return err
}

// placeOrder writes an order and its four tasks in one transaction: all of
// them or none.
func (s *shop) placeOrder(ctx context.Context, cents int) (id string, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO orders (amount_cents) VALUES ($1) RETURNING id`, cents).Scan(&id); err != nil {
			return err
		}
		for _, q := range []string{"reserve", "charge"} {
			if _, err := s.client.Outbox().Enqueue(ctx, tx, outbox.Task{Queue: q, ID: id}); err != nil {
				return err
			}
		}
		// Ships once both are done; dead with the reason, never run, if either dies.
		if _, err := s.wf.Enqueue(ctx, tx, outbox.Task{Queue: "ship", ID: id},
			workflow.On("reserve", id), workflow.On("charge", id)); err != nil {
			return err
		}
		// Runs once both finished, whatever their outcome, and undoes what succeeded.
		_, err := s.wf.Enqueue(ctx, tx, outbox.Task{Queue: "refund", ID: id},
			workflow.Dependency{Queue: "reserve", ID: id, OnFailure: workflow.Run},
			workflow.Dependency{Queue: "charge", ID: id, OnFailure: workflow.Run})
		return err
	})
	return id, err
}

// register adds the four transactional handlers: each one's writes, and its
// stored result, commit with its task's completion.
func (s *shop) register() error {
	return errors.Join(
		s.client.HandleTx("reserve", s.reserve, delayq.QueueConfig{}),
		s.client.HandleTx("charge", s.charge, delayq.QueueConfig{}),
		s.client.HandleTx("ship", s.ship, delayq.QueueConfig{}),
		s.client.HandleTx("refund", s.refund, delayq.QueueConfig{}),
	)
}

func (s *shop) reserve(ctx context.Context, tx pgx.Tx, t *delayq.Task) error {
	if s.fail == "reserve" {
		return delayq.NoRetry(errors.New("out of stock"))
	}
	var n int64
	if err := tx.QueryRow(ctx, `INSERT INTO reservations (order_id) VALUES ($1) RETURNING n`, t.ID).Scan(&n); err != nil {
		return err
	}
	return s.wf.SetResult(ctx, tx, t, fmt.Appendf(nil, "res_%d", n))
}

func (s *shop) charge(ctx context.Context, tx pgx.Tx, t *delayq.Task) error {
	if s.fail == "charge" {
		return delayq.NoRetry(errors.New("card declined"))
	}
	// An operator may retry a dead charge after its order was refunded: never
	// charge a refunded order. The row lock orders this against the refund.
	var status string
	if err := tx.QueryRow(ctx, `SELECT status FROM orders WHERE id = $1 FOR UPDATE`, t.ID).Scan(&status); err != nil {
		return err
	}
	if status == "refunded" {
		return delayq.Cancel(errors.New("order refunded"))
	}
	var n int64
	err := tx.QueryRow(ctx, `INSERT INTO charges (order_id, amount_cents)
		SELECT id, amount_cents FROM orders WHERE id = $1 RETURNING n`, t.ID).Scan(&n)
	if err != nil {
		return err
	}
	return s.wf.SetResult(ctx, tx, t, fmt.Appendf(nil, "ch_%d", n))
}

// ship runs only when reserve and charge are done: their results are final.
func (s *shop) ship(ctx context.Context, tx pgx.Tx, t *delayq.Task) error {
	res, _, err := s.wf.Result(ctx, tx, "reserve", t.ID)
	if err != nil {
		return err
	}
	ch, _, err := s.wf.Result(ctx, tx, "charge", t.ID)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO shipments (order_id, reservation, charge) VALUES ($1, $2, $3)`, t.ID, res, ch); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE orders SET status = 'shipped' WHERE id = $1`, t.ID)
	return err
}

// refund runs once reserve and charge both finished, however they ended.
func (s *shop) refund(ctx context.Context, tx pgx.Tx, t *delayq.Task) error {
	res, resState, err := s.wf.Result(ctx, tx, "reserve", t.ID)
	if err != nil {
		return err
	}
	ch, chState, err := s.wf.Result(ctx, tx, "charge", t.ID)
	if err != nil {
		return err
	}
	if resState == delayqtype.StateDone && chState == delayqtype.StateDone {
		return delayq.Cancel(errors.New("nothing to refund: reserved and charged, the order ships"))
	}
	// A step that did not finish done wrote nothing (its transaction rolled
	// back): only a done one has an effect, and a result, to undo.
	var charge, reservation *string
	if chState == delayqtype.StateDone {
		charge = ptr(string(ch))
	}
	if resState == delayqtype.StateDone {
		reservation = ptr(string(res))
	}
	if _, err := tx.Exec(ctx, `INSERT INTO refunds (order_id, charge_refunded, reservation_released) VALUES ($1, $2, $3)`,
		t.ID, charge, reservation); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE orders SET status = 'refunded' WHERE id = $1`, t.ID)
	return err
}

func ptr[T any](v T) *T { return &v }

// waitSettled returns once every order's ship and refund tasks have finished.
// It checks after each run's end (a signal from the Observer, sent after the
// run's commit), so a run that ends between a check and the wait is not missed.
func (s *shop) waitSettled(ctx context.Context, ids []string, runs <-chan struct{}) error {
	for {
		settled, err := s.settled(ctx, ids)
		if err != nil || settled {
			return err
		}
		select {
		case <-runs:
		case <-ctx.Done():
			return fmt.Errorf("orders not settled: %w", ctx.Err())
		}
	}
}

func (s *shop) settled(ctx context.Context, ids []string) (bool, error) {
	for _, id := range ids {
		for _, q := range []string{"ship", "refund"} {
			_, st, err := s.wf.Result(ctx, s.pool, q, id)
			if err != nil || !st.Finished() {
				return false, err
			}
		}
	}
	return true, nil
}

// report prints each order's outcome and the totals: every order shipped
// exactly once or refunded exactly once, never both.
func (s *shop) report(ctx context.Context, ids []string) error {
	var shipped, refunded, twice int
	for _, id := range ids {
		var ships, refunds int
		var status string
		err := s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM shipments WHERE order_id = $1),
			(SELECT count(*) FROM refunds WHERE order_id = $1), (SELECT status FROM orders WHERE id = $1)`, id).
			Scan(&ships, &refunds, &status)
		if err != nil {
			return err
		}
		_, shipState, err := s.wf.Result(ctx, s.pool, "ship", id)
		if err != nil {
			return err
		}
		_, refundState, err := s.wf.Result(ctx, s.pool, "refund", id)
		if err != nil {
			return err
		}
		fmt.Printf("%s: %s (ship %s, refund %s)\n", id, status, shipState, refundState)
		shipped += min(ships, 1)
		refunded += min(refunds, 1)
		if ships+refunds > 1 {
			twice++
		}
	}
	fmt.Printf("orders %d: shipped %d, refunded %d, shipped or refunded more than once %d\n", len(ids), shipped, refunded, twice)
	return nil
}

// runEnds is an Observer that signals runs after the end of each run.
type runEnds chan<- struct{}

func (runEnds) Claim(context.Context, delayq.ClaimEvent) {}

func (runEnds) RunStart(ctx context.Context, _ *delayq.Task) context.Context { return ctx }

func (r runEnds) RunEnd(context.Context, *delayq.Task, delayq.RunEndEvent) {
	select {
	case r <- struct{}{}:
	default: // a signal is pending: the next check sees this run too
	}
}
