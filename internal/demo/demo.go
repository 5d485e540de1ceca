// Package demo runs the whole of delayq end to end for `delayq demo`: it migrates,
// enqueues delayed tasks inside business transactions (some rolled back, some
// duplicates, some failing at first, a few that die), runs a relay and a worker,
// and reports what happened, checking the guarantees on the way.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/migrations"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// Config sets up a demo run.
type Config struct {
	DatabaseURL, RedisURL string
	// Orders is how many order transactions are attempted. Default 3000.
	Orders int
	// Spread is the window the tasks fall due in, from the start. Default 3s.
	Spread time.Duration
	// Timeout bounds the whole run. Default 90s.
	Timeout time.Duration
	// Out receives progress (when Live) and the report.
	Out io.Writer
	// Live prints a progress line that rewrites itself (for terminals).
	Live   bool
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Orders == 0 {
		c.Orders = 3000
	}
	if c.Spread == 0 {
		c.Spread = 3 * time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = 90 * time.Second
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Report is what the demo saw. Effects must equal Done, and RolledBackRun must be 0.
type Report struct {
	Enqueued        int // committed enqueues
	Duplicates      int // second enqueues of the same id, refused
	RolledBack      int // enqueues in transactions that rolled back
	RolledBackRun   int // effects of rolled-back tasks (must be 0)
	Done            int // tasks done in the outbox
	Retried         int64
	Dead            int // tasks dead in the outbox
	Effects         int // effect rows written by the handler
	Early           int // runs claimed before their due time (must be 0)
	LatenessP50     time.Duration
	LatenessP99     time.Duration
	Elapsed         time.Duration
	Suppressed      int64
	ExpectedDead    int
	ExpectedRetries int
}

// Check returns an error naming every guarantee the run broke.
func (r Report) Check() error {
	var errs []error
	if r.Effects != r.Done {
		errs = append(errs, fmt.Errorf("effects applied %d != tasks done %d", r.Effects, r.Done))
	}
	if r.RolledBackRun != 0 {
		errs = append(errs, fmt.Errorf("%d rolled-back tasks ran", r.RolledBackRun))
	}
	if r.Early != 0 {
		errs = append(errs, fmt.Errorf("%d tasks started before their due time", r.Early))
	}
	if r.Done+r.Dead != r.Enqueued {
		errs = append(errs, fmt.Errorf("done %d + dead %d != enqueued %d", r.Done, r.Dead, r.Enqueued))
	}
	if r.Dead != r.ExpectedDead {
		errs = append(errs, fmt.Errorf("dead %d, expected %d", r.Dead, r.ExpectedDead))
	}
	return errors.Join(errs...)
}

// kinds of orders: what the demo makes each one do.
const (
	kindNormal   = "normal"
	kindRollback = "rollback"  // the business transaction rolls back: the task must never run
	kindDup      = "duplicate" // enqueued again after commit: refused
	kindFlaky    = "flaky"     // fails on its first run, succeeds on the second
	kindDoomed   = "doomed"    // always fails: dead after its 2 attempts
)

func kindOf(i int) string {
	switch {
	case i%20 == 0:
		return kindRollback
	case i%25 == 1:
		return kindDup
	case i%10 == 2:
		return kindFlaky
	case i%150 == 3:
		return kindDoomed
	}
	return kindNormal
}

const queue = "charge"

// Run runs the demo and returns its report; the error includes broken guarantees.
func Run(ctx context.Context, cfg Config) (rep Report, err error) {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	start := time.Now()

	suffix := fmt.Sprintf("%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
	schema, prefix := "delayq_demo_"+suffix, "dqdemo."+suffix
	pool, rdb, err := connect(ctx, cfg, schema)
	if err != nil {
		return rep, err
	}
	defer pool.Close()
	defer rdb.Close()
	// Leave the servers as they were: the schema and the keys go when the demo ends.
	defer cleanup(pool, rdb, schema, prefix)

	fmt.Fprintf(cfg.Out, "migrating schema %s…\n", schema)
	if err := setup(ctx, pool, schema); err != nil {
		return rep, err
	}
	ob, err := outbox.New(outbox.Config{Schema: schema})
	if err != nil {
		return rep, err
	}
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix, ReapBackoffBase: 100 * time.Millisecond})
	if err != nil {
		return rep, err
	}
	rl, err := relay.New(pool, dq.AsRedis(), relay.Config{Schema: schema, ReapInterval: 200 * time.Millisecond, Logger: cfg.Logger})
	if err != nil {
		return rep, err
	}
	w, err := clientkit.NewClient(pool, dq, ob, delayq.WorkerConfig{Lease: 5 * time.Second, Logger: cfg.Logger})
	if err != nil {
		return rep, err
	}
	var (
		mu       sync.Mutex
		lateness []time.Duration
		early    atomic.Int64
	)
	handler := func(ctx context.Context, tx pgx.Tx, t *delayq.Task) error {
		late := t.ClaimedAt.Sub(t.Due)
		if t.Resumed.After(t.Due) {
			late = t.ClaimedAt.Sub(t.Resumed)
		}
		if late < 0 {
			early.Add(1)
		}
		if t.Attempt == 1 {
			mu.Lock()
			lateness = append(lateness, late)
			mu.Unlock()
		}
		kind := string(t.Payload)
		if kind == kindDoomed || kind == kindFlaky && t.Attempt == 1 {
			return fmt.Errorf("card declined (demo: %s order, attempt %d)", kind, t.Attempt)
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "demo_charges"}.Sanitize()+
			` (order_id, attempt) VALUES ($1, $2)`, t.ID, t.Attempt)
		return err
	}
	qcfg := delayq.QueueConfig{Concurrency: 32, Backoff: delayq.Backoff{Base: 200 * time.Millisecond, Max: time.Second}}
	if err := w.HandleTx(queue, handler, qcfg); err != nil {
		return rep, err
	}

	runCtx, stopRun := context.WithCancel(ctx)
	var wg sync.WaitGroup
	runErrs := make(chan error, 2)
	wg.Go(func() { runErrs <- rl.Run(runCtx) })
	wg.Go(func() { runErrs <- w.Run(runCtx) })
	defer func() {
		stopRun()
		wg.Wait()
	}()

	fmt.Fprintf(cfg.Out, "enqueueing %d orders in business transactions, due over the next %v…\n", cfg.Orders, cfg.Spread)
	if err := enqueueOrders(ctx, pool, ob, schema, cfg, &rep); err != nil {
		return rep, err
	}
	fmt.Fprintf(cfg.Out, "enqueued %d, refused %d duplicates, rolled back %d; relay and 32 workers running…\n",
		rep.Enqueued, rep.Duplicates, rep.RolledBack)

	if err := waitFinished(ctx, pool, ob, cfg, rep.Enqueued, w); err != nil {
		return rep, err
	}
	stopRun()
	wg.Wait()
	close(runErrs)
	for err := range runErrs {
		if err != nil {
			return rep, fmt.Errorf("relay or worker: %w", err)
		}
	}

	if err := collect(ctx, pool, ob, schema, &rep); err != nil {
		return rep, err
	}
	st := w.RunStats()
	rep.Retried, rep.Suppressed = st.Retried, st.Suppressed
	rep.Early = int(early.Load())
	slices.Sort(lateness)
	rep.LatenessP50, rep.LatenessP99 = pct(lateness, 50), pct(lateness, 99)
	rep.Elapsed = time.Since(start)
	printReport(cfg.Out, rep)
	return rep, rep.Check()
}

func connect(ctx context.Context, cfg Config, schema string) (*pgxpool.Pool, *redis.Client, error) {
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("database URL: %w", err)
	}
	pcfg.MaxConns = 48 // 32 transactional handlers, the relay, the producers
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, err
	}
	opt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("redis URL: %w", err)
	}
	return pool, redis.NewClient(opt), nil
}

func setup(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	db := migrations.OpenDBFromPool(pool)
	defer db.Close()
	if _, err := migrations.Up(ctx, db, migrations.Config{Schema: schema}); err != nil {
		return err
	}
	// The business tables. demo_charges has no unique constraint on order_id on
	// purpose: a duplicated effect would show as a second row.
	_, err := pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE %[1]s.demo_orders (id text PRIMARY KEY, amount_cents int NOT NULL);
		CREATE TABLE %[1]s.demo_charges (order_id text NOT NULL, attempt int NOT NULL, charged_at timestamptz NOT NULL DEFAULT now())`,
		pgx.Identifier{schema}.Sanitize()))
	return err
}

func enqueueOrders(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Client, schema string, cfg Config, rep *Report) error {
	var (
		next                     atomic.Int64
		enq, dups, rolled, doomd atomic.Int64
	)
	insertOrder := `INSERT INTO ` + pgx.Identifier{schema, "demo_orders"}.Sanitize() + ` (id, amount_cents) VALUES ($1, $2)`
	work := func() error {
		for {
			i := int(next.Add(1))
			if i > cfg.Orders {
				return nil
			}
			kind := kindOf(i)
			id := fmt.Sprintf("order-%d", i)
			// Due a little after its own commit, so lateness measures delayq, not
			// how long the demo took to enqueue the rest.
			task := outbox.Task{Queue: queue, ID: id, Payload: []byte(kind),
				Delay: 500*time.Millisecond + time.Duration(rand.Int64N(int64(cfg.Spread)))}
			if kind == kindDoomed {
				task.MaxAttempts = 2
			}
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, insertOrder, id, 100+i%900); err != nil {
					return err
				}
				if _, err := ob.Enqueue(ctx, tx, task); err != nil {
					return err
				}
				if kind == kindRollback {
					return errRollback
				}
				return nil
			})
			switch {
			case errors.Is(err, errRollback):
				rolled.Add(1)
				continue
			case err != nil:
				return err
			}
			enq.Add(1)
			if kind == kindDoomed {
				doomd.Add(1)
			}
			if kind == kindDup {
				res, err := ob.Enqueue(ctx, pool, task)
				if err != nil {
					return err
				}
				if !res.Duplicate {
					return fmt.Errorf("second enqueue of %s was not refused", id)
				}
				dups.Add(1)
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() { errs <- work() })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	rep.Enqueued, rep.Duplicates, rep.RolledBack = int(enq.Load()), int(dups.Load()), int(rolled.Load())
	rep.ExpectedDead = int(doomd.Load())
	return nil
}

var errRollback = errors.New("demo: business transaction rolled back")

// waitFinished waits until every committed task is done or dead in the outbox,
// printing progress. It polls the outbox, the thing it reports on, twice a second.
func waitFinished(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Client, cfg Config, want int, w *delayq.Client) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	store := taskstate.New(taskstate.Config{Schema: ob.Config().Schema})
	for {
		n, err := store.CountByState(ctx, pool)
		if err != nil {
			return err
		}
		pending, queued, done, dead := n[taskstate.Pending], n[taskstate.Queued], n[taskstate.Done], n[taskstate.Dead]
		if cfg.Live {
			st := w.RunStats()
			fmt.Fprintf(cfg.Out, "\r  pending %5d  in redis %5d  done %5d  dead %3d  retried %4d  running %3d ",
				pending, queued, done, dead, st.Retried, st.InFlight)
		}
		if done+dead >= int64(want) {
			if cfg.Live {
				fmt.Fprintln(cfg.Out)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("demo did not finish: %d of %d tasks done or dead: %w", done+dead, want, ctx.Err())
		case <-tick.C:
		}
	}
}

func collect(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Client, schema string, rep *Report) error {
	charges := pgx.Identifier{schema, "demo_charges"}.Sanitize()
	n, err := taskstate.New(taskstate.Config{Schema: ob.Config().Schema}).CountByState(ctx, pool)
	if err != nil {
		return err
	}
	rep.Done, rep.Dead = int(n[taskstate.Done]), int(n[taskstate.Dead])
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+charges).Scan(&rep.Effects); err != nil {
		return err
	}
	// A rolled-back order has no outbox row and no order row; its id must have no charge.
	var ids []string
	for i := 1; i <= 1_000_000 && len(ids) < rep.RolledBack; i++ {
		if kindOf(i) == kindRollback {
			ids = append(ids, fmt.Sprintf("order-%d", i))
		}
	}
	return pool.QueryRow(ctx, `SELECT count(*) FROM `+charges+` WHERE order_id = ANY($1)`, ids).Scan(&rep.RolledBackRun)
}

func cleanup(pool *pgxpool.Pool, rdb *redis.Client, schema, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	for len(keys) > 0 {
		n := min(len(keys), 1000)
		rdb.Unlink(ctx, keys[:n]...)
		keys = keys[n:]
	}
}

func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[(len(sorted)-1)*p/100]
}

func printReport(out io.Writer, r Report) {
	var b strings.Builder
	fmt.Fprintf(&b, "\ndelayq demo report (%.1fs)\n", r.Elapsed.Seconds())
	row := func(name string, v any, note string) { fmt.Fprintf(&b, "  %-28s %8v  %s\n", name, v, note) }
	row("enqueued (committed)", r.Enqueued, "")
	row("duplicates refused", r.Duplicates, "same (queue, id) enqueued again")
	row("rolled back (never run)", r.RolledBack, fmt.Sprintf("effects of these: %d", r.RolledBackRun))
	row(string(taskstate.Done), r.Done, "")
	row("retried", r.Retried, "failed runs given another try after a backoff")
	row(string(taskstate.Dead), r.Dead, "out of attempts; in Postgres and Redis, waiting for a person")
	row("effects applied", r.Effects, "must equal done")
	row("duplicate runs suppressed", r.Suppressed, "")
	row("started early", r.Early, "must be 0")
	row("claim lateness p50", r.LatenessP50.Round(10*time.Microsecond), "claimed - due, Redis clock")
	row("claim lateness p99", r.LatenessP99.Round(10*time.Microsecond), "")
	if err := r.Check(); err != nil {
		fmt.Fprintf(&b, "  GUARANTEES BROKEN: %v\n", err)
	} else {
		b.WriteString("  all guarantees held: effects == done, no rolled-back task ran, none started early\n")
	}
	fmt.Fprint(out, b.String())
}
