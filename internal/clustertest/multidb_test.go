package clustertest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/tempserver"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// Three outbox databases, each on a PostgreSQL server of its own, feed one
// Redis Cluster of 3 masters through a client per database (Config.Database),
// with the same queues and the same task ids in each. Stopping one server stops
// only its tasks: the others keep running on time, and the stopped one's run
// exactly once after it is back.
func TestSeveralDatabasesOneDown(t *testing.T) {
	t.Parallel()
	rdb, _ := testenv.RedisCluster(t)
	prefix := testenv.ClusterPrefix(t, rdb)
	queues := queueNames()[:6]
	reg := prometheus.NewRegistry()
	keys := []string{"eu1", "us1", "ap1"}
	dbs := make(map[string]*multiDB, len(keys))
	for _, key := range keys {
		dbs[key] = startDatabase(t, rdb, prefix, key, queues, reg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Round 1, every database up: the same ids in each, run once per database.
	for _, key := range keys {
		dbs[key].enqueue(t, ctx, queues, "a", 20, 0)
	}
	for _, key := range keys {
		dbs[key].waitDone(t, len(queues)*20)
	}
	before := map[string]time.Duration{}
	for _, key := range keys {
		before[key] = dbs[key].lateness(t, "a")
	}

	// Round 2: ap1's server stops; its tasks already in Redis are claimed and
	// cannot complete. eu1 and us1 run theirs, due over 2 s, on time.
	down := dbs["ap1"]
	down.enqueue(t, ctx, queues, "b", 10, 0)
	down.pg.Stop()
	for _, key := range []string{"eu1", "us1"} {
		dbs[key].enqueue(t, ctx, queues, "b", 20, 2*time.Second)
	}
	for _, key := range []string{"eu1", "us1"} {
		dbs[key].waitDone(t, len(queues)*40)
		p99 := dbs[key].lateness(t, "b")
		t.Logf("%s: lateness p99 %v with every database up, %v with ap1 down", key, before[key], p99)
		// A shared slot or a shared loop blocked on ap1 would hold these back by the
		// operation timeout (seconds); their own round took a few milliseconds.
		if p99 > time.Second {
			t.Errorf("%s: lateness p99 %v while ap1 is down (%v before)", key, p99, before[key])
		}
	}

	// ap1 back: its tasks run, once each.
	if err := down.pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	down.waitDone(t, len(queues)*30)
	for _, key := range keys {
		dbs[key].checkOnce(t)
	}
	labels := databaseLabels(t, reg)
	if !slices.Equal(labels, []string{"ap1", "eu1", "us1"}) {
		t.Errorf("metrics carry the databases %v, want each of ap1, eu1, us1", labels)
	}
}

// multiDB is one outbox database of TestSeveralDatabasesOneDown.
type multiDB struct {
	key  string
	pg   *tempserver.Postgres
	pool *pgxpool.Pool
	c    *delayq.Client
}

// startDatabase starts a PostgreSQL server for database key and runs a client
// on it (its relay in the same process) until the test ends.
func startDatabase(t *testing.T, rdb redis.UniversalClient, prefix, key string, queues []string, reg prometheus.Registerer) *multiDB {
	t.Helper()
	pg := testenv.OwnPostgres(t)
	cfg, err := pgxpool.ParseConfig(pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (
		queue text NOT NULL, task_id text NOT NULL, due timestamptz NOT NULL, claimed_at timestamptz NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	c, err := delayq.New(pool, rdb, delayq.Config{
		Prefix: prefix, Database: key, Registerer: reg, Logger: testLogger(t, key),
		Worker: delayq.WorkerConfig{Lease: 2 * time.Second, OpTimeout: 2 * time.Second,
			ErrorPause: 100 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
		Relay: &relay.Config{BatchSize: 200, ReapInterval: 200 * time.Millisecond, StatsInterval: -1, Retention: -1,
			BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range queues {
		err := c.HandleTx(q, func(ctx context.Context, tx pgx.Tx, tk *delayq.Task) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2, $3, $4)`, tk.Queue, tk.ID, tk.Due, tk.ClaimedAt)
			return err
		}, delayq.QueueConfig{Concurrency: 4, MaxAttempts: 1000})
		if err != nil {
			t.Fatal(err)
		}
	}
	background(t, key, c.Run)
	return &multiDB{key: key, pg: pg, pool: pool, c: c}
}

// enqueue commits n tasks per queue, ids round-0 .. round-(n-1), due over spread.
func (d *multiDB) enqueue(t *testing.T, ctx context.Context, queues []string, round string, n int, spread time.Duration) {
	t.Helper()
	var tasks []outbox.Task
	for _, q := range queues {
		for i := range n {
			tasks = append(tasks, outbox.Task{Queue: q, ID: fmt.Sprintf("%s-%d", round, i),
				Delay: spread * time.Duration(i) / time.Duration(max(n, 1))})
		}
	}
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		_, err := d.c.Outbox().EnqueueMany(ctx, tx, tasks)
		return err
	})
	if err != nil {
		t.Fatalf("%s: enqueue: %v", d.key, err)
	}
}

// waitDone waits until n tasks of the database are done.
func (d *multiDB) waitDone(t *testing.T, n int) {
	t.Helper()
	eventually(t, 90*time.Second, func() (bool, string) {
		var done int
		err := d.pool.QueryRow(context.Background(), `SELECT count(*) FROM delayq_outbox WHERE state = 'done'`).Scan(&done)
		return err == nil && done >= n, fmt.Sprintf("%s: %d of %d done (%v)", d.key, done, n, err)
	})
}

// lateness is the p99 of claim time minus due time of a round's tasks.
func (d *multiDB) lateness(t *testing.T, round string) time.Duration {
	t.Helper()
	var ms float64
	err := d.pool.QueryRow(context.Background(), `SELECT percentile_cont(0.99) WITHIN GROUP
		(ORDER BY extract(epoch FROM claimed_at - due) * 1000) FROM effects WHERE task_id LIKE $1 || '-%'`, round).Scan(&ms)
	if err != nil {
		t.Fatalf("%s: lateness: %v", d.key, err)
	}
	return time.Duration(ms * float64(time.Millisecond))
}

// checkOnce: every task done with exactly one effect, none claimed early.
func (d *multiDB) checkOnce(t *testing.T) {
	t.Helper()
	var notDone, twice, missing, early int
	err := d.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM delayq_outbox WHERE state <> 'done'),
		(SELECT count(*) FROM (SELECT 1 FROM effects GROUP BY queue, task_id HAVING count(*) > 1) x),
		(SELECT count(*) FROM delayq_outbox o WHERE NOT EXISTS
			(SELECT 1 FROM effects e WHERE e.queue = o.queue AND e.task_id = o.task_id)),
		(SELECT count(*) FROM effects e JOIN delayq_outbox o USING (queue, task_id)
			WHERE e.claimed_at < date_trunc('milliseconds', o.run_at))`).Scan(&notDone, &twice, &missing, &early)
	if err != nil {
		t.Fatal(err)
	}
	if notDone+twice+missing+early > 0 {
		t.Errorf("%s: %d not done, %d run twice, %d without an effect, %d claimed early", d.key, notDone, twice, missing, early)
	}
}

// databaseLabels lists the values of the label database on the worker's claim
// counter.
func databaseLabels(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "delayq_worker_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "database" {
					seen[l.GetValue()] = true
				}
			}
		}
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
