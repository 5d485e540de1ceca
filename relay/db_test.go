package relay_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// countingDB is a DB of the application's own: a pool that counts the
// transactions begun and the connections acquired through it.
type countingDB struct {
	*pgxpool.Pool
	begun, acquired atomic.Int64
}

func (c *countingDB) Begin(ctx context.Context) (pgx.Tx, error) {
	c.begun.Add(1)
	return c.Pool.Begin(ctx)
}

func (c *countingDB) Acquire(ctx context.Context) (*pgxpool.Conn, error) {
	c.acquired.Add(1)
	return c.Pool.Acquire(ctx)
}

// Relay and worker take any DB, not only a *pgxpool.Pool: tasks go through a
// relay and a worker both on a wrapper, done exactly once.
func TestRelayAndWorkerOnAWrappedDB(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rdb := &countingDB{Pool: testenv.Pool(t, b.url)}
	rl, err := relay.New(rdb, b.dq.AsRedis(), relay.Config{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	wdb := &countingDB{Pool: testenv.Pool(t, b.url)}
	w, err := clientkit.NewClient(wdb, b.dq, b.ob, delayq.WorkerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `CREATE TABLE effects (id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if err := w.HandleTx("q", func(ctx context.Context, tx pgx.Tx, tk *delayq.Task) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, tk.ID)
		return err
	}, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	go func() { done <- rl.Run(ctx) }()
	go func() { done <- w.Run(ctx) }()
	const n = 20
	for i := range n {
		if _, err := b.ob.Enqueue(ctx, b.pool, outbox.Task{Queue: "q", ID: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		var d int
		_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE state = 'done'`).Scan(&d)
		return d == n, fmt.Sprintf("%d of %d done", d, n)
	})
	var effects, distinct int
	if err := b.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT id) FROM effects`).Scan(&effects, &distinct); err != nil {
		t.Fatal(err)
	}
	if effects != n || distinct != n {
		t.Errorf("%d effects of %d tasks (%d distinct)", effects, n, distinct)
	}
	if rdb.acquired.Load() == 0 {
		t.Error("the relay acquired no connection from its DB (its rounds hold one)")
	}
	cancel()
	for range 2 {
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}
