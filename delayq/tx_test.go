package delayq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// tripLog records what a pool sends to Postgres, one entry per message: a query's
// first word, or a batch's first words joined by spaces. The worker's connection
// pool also runs its own statements (none during a successful transactional run).
type tripLog struct {
	mu    sync.Mutex
	trips []string
}

func firstWord(sql string) string {
	f := strings.FieldsFunc(sql, func(r rune) bool { return r == ' ' || r == '\n' || r == '\t' || r == ';' })
	if len(f) == 0 {
		return ""
	}
	return strings.ToUpper(f[0])
}

func (l *tripLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.trips = append(l.trips, s)
}

// take returns the entries so far and starts a new log.
func (l *tripLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.trips
	l.trips = nil
	return t
}

func (l *tripLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(d.SQL, "SELECT to_regclass(") {
		return ctx // Run's start-up look for the table (outbox.CheckMigrated), not a run's round trip
	}
	l.add(firstWord(d.SQL))
	return ctx
}

func (l *tripLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *tripLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	words := make([]string, len(d.Batch.QueuedQueries))
	for i, q := range d.Batch.QueuedQueries {
		words[i] = firstWord(q.SQL)
	}
	l.add(strings.Join(words, " "))
	return ctx
}

func (l *tripLog) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (l *tripLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func tracedPool(t *testing.T, url string) (*pgxpool.Pool, *tripLog) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	log := &tripLog{}
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, log
}

// The transaction a TxHandler gets sends BEGIN with the handler's first statement
// (or not at all), whatever the handler uses of pgx.Tx, and everything the handler
// wrote commits with the completion. Each case runs one task and checks the
// messages sent for it, and the effect rows it left. Both with pgx's default
// (prepared statements) and with the simple protocol that PgBouncer's transaction
// pooling asks for, where a batch goes as one multi-statement query.
func TestHandlerTx(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cache_statement", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testHandlerTx(t, mode)
		})
	}
}

func testHandlerTx(t *testing.T, execMode string) {
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	pool, log := tracedPool(t, withParam(t, b.url, "default_query_exec_mode", execMode))
	insert := `INSERT INTO effects (task_id, attempt, worker) VALUES ($1, $2, $3)`
	cases := []struct {
		name    string
		handle  func(ctx context.Context, tx pgx.Tx, tk *Task) error
		trips   []string
		effects int
	}{{
		name:   "nothing written",
		handle: func(context.Context, pgx.Tx, *Task) error { return nil },
		trips:  []string{"UPDATE"},
	}, {
		name: "exec",
		handle: func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			_, err := tx.Exec(ctx, insert, tk.ID, tk.Attempt, "exec")
			return err
		},
		trips: []string{"BEGIN INSERT", "WITH COMMIT"}, effects: 1,
	}, {
		name: "exec named args",
		handle: func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (task_id, attempt) VALUES (@id, @attempt)`,
				pgx.NamedArgs{"id": tk.ID, "attempt": tk.Attempt})
			return err
		},
		trips: []string{"BEGIN INSERT", "WITH COMMIT"}, effects: 1,
	}, {
		name: "exec without arguments, two statements",
		handle: func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO effects (task_id, attempt) VALUES ('%[1]s', 0);
				INSERT INTO effects (task_id, attempt) VALUES ('%[1]s', 1)`, tk.ID))
			return err
		},
		trips: []string{"BEGIN", "WITH COMMIT"}, effects: 2,
	}, {
		name: "exec in a mode a batch cannot take",
		handle: func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			_, err := tx.Exec(ctx, insert, pgx.QueryExecModeSimpleProtocol, tk.ID, tk.Attempt, "simple")
			return err
		},
		trips: []string{"BEGIN", "INSERT", "WITH COMMIT"}, effects: 1,
	}, {
		name: "query, then exec on the freed connection",
		handle: func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			rows, err := tx.Query(ctx, insert+` RETURNING task_id`, tk.ID, tk.Attempt, "query")
			if err != nil {
				return err
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return err
			}
			if !slices.Equal(got, []string{tk.ID}) {
				return fmt.Errorf("returned %q", got)
			}
			_, err = tx.Exec(ctx, insert, tk.ID, tk.Attempt, "query 2")
			return err
		},
		trips: []string{"BEGIN INSERT", "INSERT", "WITH COMMIT"}, effects: 2,
	}, {
		name: "query row",
		handle: func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			var id string
			if err := tx.QueryRow(ctx, insert+` RETURNING task_id`, tk.ID, tk.Attempt, "row").Scan(&id); err != nil {
				return err
			}
			if id != tk.ID {
				return fmt.Errorf("returned %q", id)
			}
			return nil
		},
		trips: []string{"BEGIN INSERT", "WITH COMMIT"}, effects: 1,
	}, {
		name: "query row without a row",
		handle: func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			var n int
			if err := tx.QueryRow(ctx, `SELECT 1 FROM effects WHERE task_id = $1`, tk.ID).Scan(&n); !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("scan: %v, want pgx.ErrNoRows", err)
			}
			_, err := tx.Exec(ctx, insert, tk.ID, tk.Attempt, "no row")
			return err
		},
		trips: []string{"BEGIN SELECT", "INSERT", "WITH COMMIT"}, effects: 1,
	}, {
		name: "batch",
		handle: func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			bt := &pgx.Batch{}
			bt.Queue(insert, tk.ID, tk.Attempt, "batch 1")
			bt.Queue(insert, tk.ID, tk.Attempt, "batch 2")
			return tx.SendBatch(ctx, bt).Close()
		},
		trips: []string{"BEGIN INSERT INSERT", "WITH COMMIT"}, effects: 2,
	}, {
		name: "copy",
		handle: func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"effects"}, []string{"task_id", "attempt"},
				pgx.CopyFromRows([][]any{{tk.ID, 0}, {tk.ID, 1}, {tk.ID, 2}}))
			return err
		},
		trips: []string{"BEGIN", "WITH COMMIT"}, effects: 3,
	}, {
		name: "savepoints after the first statement",
		handle: func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if _, err := tx.Exec(ctx, insert, tk.ID, tk.Attempt, "kept"); err != nil {
				return err
			}
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, insert, tk.ID, tk.Attempt, "rolled back"); err != nil {
				return err
			}
			if err := sp.Rollback(ctx); err != nil {
				return err
			}
			sp, err = tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, insert, tk.ID, tk.Attempt, "released"); err != nil {
				return err
			}
			return sp.Commit(ctx)
		},
		trips:   []string{"BEGIN INSERT", "SAVEPOINT", "SAVEPOINT", "INSERT", "ROLLBACK", "SAVEPOINT", "INSERT", "RELEASE", "WITH COMMIT"},
		effects: 2,
	}, {
		name: "savepoint first",
		handle: func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, insert, tk.ID, tk.Attempt, "savepoint"); err != nil {
				return err
			}
			return sp.Commit(ctx)
		},
		trips: []string{"BEGIN", "SAVEPOINT", "INSERT", "RELEASE", "WITH COMMIT"}, effects: 1,
	}, {
		name: "the connection",
		handle: func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			_, err := tx.Conn().Exec(ctx, insert, tk.ID, tk.Attempt, "conn")
			return err
		},
		trips: []string{"BEGIN", "INSERT", "WITH COMMIT"}, effects: 1,
	}, {
		name: "large object",
		handle: func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			lo := tx.LargeObjects()
			oid, err := lo.Create(ctx, 0)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, insert, tk.ID, tk.Attempt, fmt.Sprint(oid))
			return err
		},
		trips: []string{"BEGIN", "SELECT", "INSERT", "WITH COMMIT"}, effects: 1,
	}}
	h := b.startOn(t, pool, WorkerConfig{}, func(w *worker) {
		for _, c := range cases {
			if err := w.HandleTx(queueName(c.name), c.handle, QueueConfig{}); err != nil {
				t.Fatal(err)
			}
		}
	})
	for _, c := range cases {
		log.take()
		q := queueName(c.name)
		b.enqueue(t, task(q, "t1")) // on b.pool, not traced
		h.expect(t, "t1", outSucceeded)
		if got := log.take(); !slices.Equal(got, c.trips) {
			t.Errorf("%s: sent %q, want %q", c.name, got, c.trips)
		}
		if got := b.row(t, q, "t1").state; got != "done" {
			t.Errorf("%s: outbox state %s, want done", c.name, got)
		}
		if got := b.count(t, `SELECT count(*) FROM effects WHERE task_id = 't1'`); got != c.effects {
			t.Errorf("%s: %d effect rows, want %d", c.name, got, c.effects)
		}
		if _, err := b.pool.Exec(ctx, `DELETE FROM effects`); err != nil {
			t.Fatal(err)
		}
	}
	// The large object was created in the committed transaction.
	var oid uint32
	if err := b.pool.QueryRow(ctx, `SELECT max(oid::bigint) FROM pg_largeobject_metadata`).Scan(&oid); err != nil || oid == 0 {
		t.Errorf("large object: %v, oid %d", err, oid)
	}
}

// queueName makes a queue name of a test case's.
func queueName(s string) string {
	return strings.NewReplacer(" ", "-", ",", "").Replace(s)
}

// A handler that commits or rolls back its transaction is told ErrTxOwned, and its
// run fails: what it wrote is rolled back and the task is retried. The effect is
// applied once, by the run that leaves the transaction to the worker.
func TestHandlerTxEndRefused(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"commit", "rollback"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			h := b.start(t, WorkerConfig{}, func(w *worker) {
				_ = w.HandleTx("q", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
					if err := insertEffect(ctx, tx, tk, end); err != nil {
						return err
					}
					if tk.Attempt > 1 {
						return nil
					}
					err := tx.Commit(ctx)
					if end == "rollback" {
						err = tx.Rollback(ctx)
					}
					if !errors.Is(err, ErrTxOwned) {
						return fmt.Errorf("%s: %v, want ErrTxOwned", end, err)
					}
					return nil // the run fails all the same
				}, QueueConfig{Backoff: Backoff{Base: time.Millisecond, Max: time.Millisecond}})
			})
			b.enqueue(t, task("q", "t1"))
			h.expect(t, "t1", outRetried)
			h.expect(t, "t1", outSucceeded)
			if n := b.count(t, `SELECT count(*) FROM effects WHERE attempt = 1`); n != 0 {
				t.Errorf("%d effect rows of the run that called %s, want 0", n, end)
			}
			if n := b.count(t, `SELECT count(*) FROM effects`); n != 1 {
				t.Errorf("%d effect rows, want 1", n)
			}
			// The guard leaves the last error alone: the first run's.
			if r := b.row(t, "q", "t1"); r.state != "done" || !strings.Contains(r.lastError, "committed or rolled back by the worker") {
				t.Errorf("outbox row %s, last error %q", r.state, r.lastError)
			}
		})
	}
}
