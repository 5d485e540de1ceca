package clustertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/tempserver"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

func TestMain(m *testing.M) {
	// A child process of TestSeveralDatabasesFaults (multidb_faults_test.go).
	if role := os.Getenv(envMDBRole); role != "" {
		os.Exit(multiDBChild(role))
	}
	// go-redis logs every refused dial to a killed master on its own logger; the
	// tests count and report the errors that matter themselves.
	redis.SetLogger(quietLogger{})
	testenv.Main(m)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// queueCount is how many queues every test spreads over the cluster's slots.
const queueCount = 50

// queueNames returns the queues of the tests: "q00" ... "q49".
func queueNames() []string {
	qs := make([]string, queueCount)
	for i := range qs {
		qs[i] = fmt.Sprintf("q%02d", i)
	}
	return qs
}

// byMaster groups queues by the master that serves their slot now, and fails the
// test unless every master serves some of them: the tests must exercise every
// node, and scripts and pipelines that cross nodes.
func byMaster(t testing.TB, rdb *redis.ClusterClient, cl *tempserver.RedisCluster, queues []string) map[string][]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	masters, err := cl.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	slots := map[int]bool{}
	for _, q := range queues {
		k, err := dispatch.KeysFor("p", q)
		if err != nil {
			t.Fatal(err)
		}
		slot := tempserver.Slot(k.Ready)
		if got, err := rdb.ClusterKeySlot(ctx, k.Ready).Result(); err != nil || got != int64(slot) {
			t.Fatalf("slot of %s: Redis says %d (%v), tempserver.Slot %d", k.Ready, got, err, slot)
		}
		slots[slot] = true
		m, err := cl.MasterFor(ctx, k.Ready)
		if err != nil {
			t.Fatal(err)
		}
		out[m.Addr()] = append(out[m.Addr()], q)
	}
	if len(out) != len(masters) {
		t.Fatalf("%d queues on %d of %d masters: %v", len(queues), len(out), len(masters), out)
	}
	if len(slots) != len(queues) {
		t.Fatalf("%d queues in only %d slots", len(queues), len(slots))
	}
	return out
}

// newDQ returns a delayq client on rdb under prefix, with short reap backoffs (a
// task whose lease expired is due again after at most 20ms) and maxWait, the
// backstop against lost wake-ups: long where a test proves that wake-ups arrive.
func newDQ(t testing.TB, rdb redis.UniversalClient, prefix string, maxWait time.Duration) *dispatch.Client {
	t.Helper()
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix,
		ReapBackoffBase: 10 * time.Millisecond, ReapBackoffMax: 20 * time.Millisecond, MaxWait: maxWait})
	if err != nil {
		t.Fatal(err)
	}
	return dq
}

// pgBundle is a database of the test's own, with an effects table for
// transactional handlers: deliberately without a unique constraint, so that a
// second application of an effect shows up as a second row.
type pgBundle struct {
	url  string
	pool *pgxpool.Pool
	ob   *outbox.Client
}

func newPG(t testing.TB) pgBundle {
	t.Helper()
	url := testenv.PostgresURL(t)
	pool := testenv.Pool(t, url)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (
		queue text NOT NULL, task_id text NOT NULL, attempt int NOT NULL, worker text NOT NULL,
		due timestamptz NOT NULL, claimed_at timestamptz NOT NULL,
		at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return pgBundle{url: url, pool: pool, ob: ob}
}

// workerPool opens a pool for one worker: 16 connections, more than the default
// (4 on 2 cores) since 50 queues run handlers that each hold one.
func (p pgBundle) workerPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(p.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// effect is the transactional effect of a task: one row in effects.
func effect(ctx context.Context, tx pgx.Tx, name string, t *delayq.Task) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (queue, task_id, attempt, worker, due, claimed_at)
		VALUES ($1, $2, $3, $4, $5, $6)`, t.Queue, t.ID, t.Attempt, name, t.Due, t.ClaimedAt)
	return err
}

// produce inserts tasks into the outbox, n per committed transaction.
func (p pgBundle) produce(t testing.TB, tasks []outbox.Task, n int) {
	t.Helper()
	if err := p.insert(context.Background(), tasks, n); err != nil {
		t.Fatal(err)
	}
}

// insert is produce for other goroutines than the test's.
func (p pgBundle) insert(ctx context.Context, tasks []outbox.Task, n int) error {
	for start := 0; start < len(tasks); start += n {
		batch := tasks[start:min(start+n, len(tasks))]
		err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
			res, err := p.ob.EnqueueMany(ctx, tx, batch)
			if err == nil && res.Inserted != len(batch) {
				err = fmt.Errorf("%d of %d inserted", res.Inserted, len(batch))
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("produce: %w", err)
		}
	}
	return nil
}

// states counts the outbox rows by state.
func (p pgBundle) states(t testing.TB) map[string]int {
	t.Helper()
	rows, err := p.pool.Query(context.Background(), `SELECT state, count(*) FROM delayq_outbox GROUP BY state`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	var s string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&s, &n}, func() error { out[s] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// count runs a query returning one integer.
func (p pgBundle) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := p.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// checkEffects asserts the invariants of docs/DESIGN.md on the effects table: every
// done row has exactly one effect, no other row has any, and no effect started
// before its task was due (Redis clock at the claim against the outbox run_at, to
// the millisecond: delayq keeps due times in whole ms).
func (p pgBundle) checkEffects(t testing.TB) {
	t.Helper()
	if n := p.count(t, `SELECT count(*) FROM (SELECT 1 FROM effects GROUP BY queue, task_id HAVING count(*) > 1) d`); n > 0 {
		t.Errorf("%d tasks have more than one effect", n)
	}
	if n := p.count(t, `SELECT count(*) FROM delayq_outbox o WHERE o.state = 'done'
		AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.queue = o.queue AND e.task_id = o.task_id)`); n > 0 {
		t.Errorf("%d done tasks without an effect", n)
	}
	if n := p.count(t, `SELECT count(*) FROM effects e JOIN delayq_outbox o USING (queue, task_id)
		WHERE o.state <> 'done'`); n > 0 {
		t.Errorf("%d effects of tasks that are not done", n)
	}
	if n := p.count(t, `SELECT count(*) FROM effects e JOIN delayq_outbox o USING (queue, task_id)
		WHERE e.claimed_at < date_trunc('milliseconds', o.run_at)`); n > 0 {
		t.Errorf("%d tasks claimed before they were due", n)
	}
}

// runRelay runs a relay until the test ends; Run must then return nil.
func runRelay(t testing.TB, url string, dq *dispatch.Client, cfg relay.Config) *relay.Relay {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t, "relay")
	}
	rl, err := relay.New(testenv.Pool(t, url), dq.AsRedis(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	background(t, "relay", rl.Run)
	return rl
}

// startEffectWorkers runs workers w1 and w2 on every queue, with transactional
// handlers that write the effects table, until the test ends.
func startEffectWorkers(t testing.TB, pg pgBundle, dq *dispatch.Client, queues []string) []*delayq.Client {
	t.Helper()
	var workers []*delayq.Client
	for _, name := range []string{"w1", "w2"} {
		w, err := clientkit.NewClient(pg.workerPool(t), dq, pg.ob, delayq.WorkerConfig{Lease: 2 * time.Second,
			OpTimeout: 3 * time.Second, ErrorPause: 100 * time.Millisecond, ShutdownTimeout: 5 * time.Second,
			Logger: testLogger(t, name)})
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range queues {
			err := w.HandleTx(q, func(ctx context.Context, tx pgx.Tx, tk *delayq.Task) error {
				return effect(ctx, tx, name, tk)
			}, delayq.QueueConfig{Concurrency: 2})
			if err != nil {
				t.Fatal(err)
			}
		}
		background(t, name, w.Run)
		workers = append(workers, w)
	}
	return workers
}

// background runs run until the test ends, then cancels it and checks it
// returned nil.
func background(t testing.TB, name string, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: Run: %v", name, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s: Run did not return 30s after its context ended", name)
		}
	})
}

// testLogger logs the first warnings and errors of each message to the test log
// and counts the others: a master failover makes every claim loop warn. The
// counts are logged when the test ends.
func testLogger(t testing.TB, name string) *slog.Logger {
	h := &logHandler{t: t, name: name, n: map[string]int{}}
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, msg := range sample(h.n, len(h.n)) {
			if h.n[msg] > logFirst {
				t.Logf("%s: %q logged %d times", name, msg, h.n[msg])
			}
		}
	})
	return slog.New(h)
}

// logFirst is how many records of one message go to the test log.
const logFirst = 3

type logHandler struct {
	t    testing.TB
	name string
	mu   sync.Mutex
	n    map[string]int
}

func (h *logHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *logHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.n[r.Message]++
	n := h.n[r.Message]
	h.mu.Unlock()
	if n > logFirst {
		return nil
	}
	var b strings.Builder
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	h.t.Logf("%s: %s %s%s", h.name, r.Level, r.Message, b.String())
	return nil
}

func (h *logHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logHandler) WithGroup(string) slog.Handler      { return h }

// eventually polls cond until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not after %v: %s", timeout, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stats sums the delayq stats of queues.
func stats(t testing.TB, dq *dispatch.Client, queues []string) dispatch.Stats {
	t.Helper()
	var sum dispatch.Stats
	for _, q := range queues {
		s, err := dq.Stats(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		sum.Ready += s.Ready
		sum.Active += s.Active
		sum.Dead += s.Dead
		sum.DueNow += s.DueNow
	}
	return sum
}

// waitSubscribed waits until n subscribers listen to the wake-ups of every queue.
// A subscriber connection sits on any node; PUBSUB NUMSUB counts a node's own, so
// the counts of all nodes are added up.
func waitSubscribed(t testing.TB, rdb *redis.ClusterClient, dq *dispatch.Client, queues []string, n int64) {
	t.Helper()
	channels := make([]string, len(queues))
	for i, q := range queues {
		k, err := dq.Keys(q)
		if err != nil {
			t.Fatal(err)
		}
		channels[i] = k.Wake
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		var mu sync.Mutex
		sum := map[string]int64{}
		err := rdb.ForEachShard(context.Background(), func(ctx context.Context, c *redis.Client) error {
			m, err := c.PubSubNumSub(ctx, channels...).Result()
			mu.Lock()
			defer mu.Unlock()
			for ch, k := range m {
				sum[ch] += k
			}
			return err
		})
		if err != nil {
			return false, err.Error()
		}
		for _, ch := range channels {
			if sum[ch] != n {
				return false, fmt.Sprintf("%s has %d subscribers, want %d", ch, sum[ch], n)
			}
		}
		return true, ""
	})
}

// counter counts events by key, safe for concurrent use.
type counter struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *counter) add(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[key]++
	return c.m[key]
}

func (c *counter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.m))
	for k, v := range c.m {
		out[k] = v
	}
	return out
}

// sample returns up to n sorted keys of m, for messages.
func sample(m map[string]int, n int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys[:min(n, len(keys))]
}

var errInjected = errors.New("injected failure")
