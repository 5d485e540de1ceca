package relay_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/tempserver"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/relay"
)

// Behind PgBouncer in transaction mode, with pgx's simple protocol: producers,
// two relays in PollOnly mode and a worker with a transactional handler all go
// through the pooler. Every task runs exactly once, the relays make no errors, no
// LISTEN is sent, and one relay at a time leads the self-healing (its lock held by
// an open transaction, which the pooler keeps on one server connection).
func TestPollOnlyThroughPgBouncer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	pgb, err := tempserver.StartPgBouncer(ctx, b.url)
	if errors.Is(err, tempserver.ErrNoPgBouncer) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pgb.Close)
	url, err := pgb.URL(b.url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `CREATE TABLE effects (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}

	var relays []*relay.Relay
	for range 2 {
		rl, err := relay.New(testenv.Pool(t, url), b.dq.AsRedis(), relay.Config{
			PollOnly: true, PollInterval: 100 * time.Millisecond, LeaderRetry: 200 * time.Millisecond,
			Logger: testLogger(t),
		})
		if err != nil {
			t.Fatal(err)
		}
		relays = append(relays, rl)
		runUntilCleanup(t, rl.Run)
	}
	pool := testenv.Pool(t, url)
	w, err := clientkit.NewClient(pool, b.dq, b.ob, delayq.WorkerConfig{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	err = w.HandleTx("pgb", func(ctx context.Context, tx pgx.Tx, tk *delayq.Task) error {
		runs.Add(1)
		_, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, tk.ID)
		return err
	}, delayq.QueueConfig{})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, w.Run)

	// Producers through the pooler, in their transactions, some due later.
	const n = 200
	for i := range n {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tk := task("pgb", fmt.Sprintf("t%03d", i))
		if i%4 == 0 {
			tk.RunAt = time.Now().Add(300 * time.Millisecond)
		}
		if _, err := b.ob.Enqueue(ctx, tx, tk); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, time.Minute, func() (bool, string) {
		l0, l1 := relays[0].Stats().Leader, relays[1].Stats().Leader
		if l0 && l1 {
			t.Fatal("both relays lead the self-healing")
		}
		var done, effects int
		if err := b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM delayq_outbox WHERE state = 'done'),
			(SELECT count(*) FROM effects)`).Scan(&done, &effects); err != nil {
			return false, err.Error()
		}
		return done == n && effects == n && (l0 || l1), fmt.Sprintf("%d done, %d effects, leaders %v %v", done, effects, l0, l1)
	})
	if got := runs.Load(); got != n {
		t.Errorf("%d runs for %d tasks", got, n)
	}
	for i, rl := range relays {
		if s := rl.Stats(); s.Errors != 0 {
			t.Errorf("relay %d: %d errors", i, s.Errors)
		}
	}
	var listens int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND query ILIKE 'LISTEN%'`).Scan(&listens); err != nil || listens != 0 {
		t.Errorf("%d LISTEN sessions (%v), want none in PollOnly mode", listens, err)
	}
	// The lock is a transaction's: one server connection idle in a transaction.
	var held int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND a.datname = current_database() AND a.state = 'idle in transaction'`).Scan(&held); err != nil || held != 1 {
		t.Errorf("%d advisory locks held in open transactions (%v), want the leader's", held, err)
	}
}

// runUntilCleanup runs run until the test ends; it must then return nil.
func runUntilCleanup(t *testing.T, run func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// BenchmarkRelayLatency measures the time from a producer's commit to the task in
// Redis, for a task due at once, with LISTEN and in PollOnly mode (whose cost is
// this wait: up to the poll interval, half of it on average). Each op is one task
// on an idle relay, committed at a random moment of the poll cycle (the pause
// before it is not timed): go test -run '^$' -bench RelayLatency -benchtime 40x ./relay/
func BenchmarkRelayLatency(b *testing.B) {
	for _, c := range []struct {
		name string
		cfg  relay.Config
	}{
		{"listen", relay.Config{}},
		{"poll-only-1s", relay.Config{PollOnly: true, PollInterval: time.Second}},
		{"poll-only-200ms", relay.Config{PollOnly: true, PollInterval: 200 * time.Millisecond}},
	} {
		b.Run(c.name, func(b *testing.B) {
			tb := setup(b)
			ctx := context.Background()
			c.cfg.ReapInterval, c.cfg.StatsInterval, c.cfg.RepairRate = -1, -1, -1
			rl, err := relay.New(tb.pool, tb.dq.AsRedis(), c.cfg)
			if err != nil {
				b.Fatal(err)
			}
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- rl.Run(rctx) }()
			defer func() { cancel(); <-done }()
			var total, worst time.Duration
			b.ResetTimer()
			for i := range b.N {
				id := fmt.Sprintf("b%d", i)
				b.StopTimer()
				time.Sleep(rand.N(max(c.cfg.PollInterval, time.Millisecond))) // a random phase of the cycle
				b.StartTimer()
				start := time.Now()
				tx, err := tb.pool.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := tb.ob.Enqueue(ctx, tx, task("lat", id)); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					b.Fatal(err)
				}
				for {
					ti, err := tb.dq.Inspect(ctx, "lat", id)
					if err != nil {
						b.Fatal(err)
					}
					if ti[0].State != "missing" {
						break
					}
					time.Sleep(time.Millisecond) // polling the measured state, not waiting on luck
				}
				took := time.Since(start)
				total, worst = total+took, max(worst, took)
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/task")
			b.ReportMetric(float64(worst.Microseconds())/1000, "max-ms")
		})
	}
}
