package faults

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"strconv"
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
	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// TestMain runs the tests, or, when this binary was re-executed as a worker or
// relay process of a scenario, that process.
func TestMain(m *testing.M) {
	if role := os.Getenv(envRole); role != "" {
		os.Exit(childMain(role))
	}
	testenv.Main(m)
}

// Timings shared by every component of a scenario: short leases and backoffs so
// that a fault is recovered from within a second or two.
const (
	lease          = 1500 * time.Millisecond
	heartbeat      = 300 * time.Millisecond
	reapInterval   = 100 * time.Millisecond
	workerConc     = 8
	payloadOK      = "ok"
	payloadFail    = "fail" // the handler always fails: the task ends dead
	failAttempts   = 2      // max attempts of the failing tasks
	scenarioBudget = 100 * time.Second
)

// errInjected is the failure of the tasks meant to end dead.
var errInjected = errors.New("faults: injected handler failure")

// SQL of the effects table. No unique constraint: a second effect of one task
// would be a second row, and the checker counts rows.
const (
	sqlEffectsTable = `CREATE TABLE IF NOT EXISTS fault_effects (
		queue text NOT NULL, task_id text NOT NULL, attempt int NOT NULL, version int NOT NULL,
		worker text NOT NULL, due timestamptz NOT NULL, claimed_at timestamptz NOT NULL,
		local_at timestamptz NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp())`
	sqlInsertEffect = `INSERT INTO fault_effects (queue, task_id, attempt, version, worker, due, claimed_at, local_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`
)

// system is one scenario's servers and the clients the test itself uses.
type system struct {
	t        *testing.T
	scenario string
	pgURL    string
	// redisURL is what the product's clients use (a proxy in the slow-Redis
	// scenario); directURL reaches the server itself, for the checker.
	redisURL, directURL string
	prefix              string
	queues              []string
	doneRetention       time.Duration    // delayq.Config.DoneRetention of every component (0: the default)
	groupCommit         int              // worker.GroupCommit.MaxTasks of every worker (0: off)
	shards              int              // the shard count of the queues (0: unsharded)
	admin               *pgxpool.Pool    // producer and checker
	rdb                 *redis.Client    // on directURL
	dq                  *dispatch.Client // on rdb
	ob                  *outbox.Client
	logs                *syncBuffer // in-process components' logs
	logDir              string      // child processes' logs
	started             time.Time
}

// newSystem prepares a scenario on a migrated database at pgURL and a Redis at
// redisURL: the effects table, the clients, and a dump of logs if the test fails.
func newSystem(t *testing.T, scenario, pgURL, redisURL string) *system {
	t.Helper()
	s := &system{
		t: t, scenario: scenario, pgURL: pgURL, redisURL: redisURL, directURL: redisURL,
		prefix: "fq", queues: []string{"alpha", "beta", "gamma"},
		logs: &syncBuffer{}, logDir: t.TempDir(), started: time.Now(),
	}
	// DELAYQ_FAULTS_GROUP_COMMIT=8 runs every scenario's workers with group commit.
	if v := os.Getenv(envGroupCommit); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", envGroupCommit, v, err)
		}
		s.groupCommit = n
	}
	s.admin = testenv.Pool(t, withParam(t, pgURL, "pool_max_conns", "8"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.admin.Exec(ctx, sqlEffectsTable); err != nil {
		t.Fatalf("effects table: %v", err)
	}
	var err error
	if s.rdb, err = newRedis(redisURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.rdb.Close() })
	if s.dq, err = newDelayq(s.rdb, s.prefix, 0); err != nil {
		t.Fatal(err)
	}
	if s.ob, err = outbox.New(outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	if scenario != "model" { // the model shards its own queues
		s.shardQueues(ctx, 0) // DELAYQ_FAULTS_SHARDS, if set
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("in-process logs (tail):\n%s", tail(s.logs.String(), 6000))
			s.dumpChildLogs()
		}
	})
	return s
}

// shardQueues splits every queue of the scenario into n shards (none for n < 2),
// in Postgres and in Redis, before any task exists. DELAYQ_FAULTS_SHARDS=3 does
// it for every scenario.
func (s *system) shardQueues(ctx context.Context, n int) {
	s.t.Helper()
	if v := os.Getenv(envShards); v != "" && n == 0 {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			s.t.Fatalf("%s=%q: %v", envShards, v, err)
		}
	}
	if n < 2 {
		return
	}
	s.shards = n
	ctl, err := queuectl.New(s.admin, s.dq, s.ob.Config().Schema)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, q := range s.queues {
		if _, err := ctl.SetShards(ctx, q, n); err != nil {
			s.t.Fatal(err)
		}
	}
}

// ctx is the scenario's context, bounded by its time budget.
func (s *system) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), scenarioBudget)
	s.t.Cleanup(cancel)
	return ctx
}

func (s *system) logger(name string) *slog.Logger {
	return slog.New(slog.NewTextHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelWarn})).With("component", name)
}

// delayqClient opens a client on rawURL with the suite's settings, closed when
// the test ends.
func (s *system) delayqClient(t testing.TB, rawURL string, hooks ...redis.Hook) *dispatch.Client {
	t.Helper()
	rdb, err := newRedis(rawURL, hooks...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	dq, err := newDelayq(rdb, s.prefix, s.doneRetention)
	if err != nil {
		t.Fatal(err)
	}
	return dq
}

// newRedis opens a go-redis client on rawURL.
func newRedis(rawURL string, hooks ...redis.Hook) (*redis.Client, error) {
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	opt.DialTimeout = 2 * time.Second
	rdb := redis.NewClient(opt)
	for _, h := range hooks {
		rdb.AddHook(h)
	}
	return rdb, nil
}

// newDelayq is the delayq client every component uses: reaped tasks run again
// within 100ms, and a waiting worker looks again at least every 5s.
func newDelayq(rdb redis.UniversalClient, prefix string, doneRetention time.Duration) (*dispatch.Client, error) {
	return dispatch.New(rdb, dispatch.Config{
		Prefix: prefix, ReapBackoffBase: 20 * time.Millisecond, ReapBackoffMax: 100 * time.Millisecond,
		MaxWait: 5 * time.Second, DoneRetention: doneRetention,
	})
}

func workerConfig(log *slog.Logger) delayq.WorkerConfig {
	return delayq.WorkerConfig{
		Lease: lease, HeartbeatInterval: heartbeat, ShutdownTimeout: 2 * time.Second,
		OpTimeout: 3 * time.Second, ErrorPause: 100 * time.Millisecond, Logger: log,
	}
}

// queueConfig is every worker's queue configuration; group is
// GroupCommit.MaxTasks (0: off).
func queueConfig(group int) delayq.QueueConfig {
	return delayq.QueueConfig{
		Concurrency: workerConc,
		Backoff:     delayq.Backoff{Base: 50 * time.Millisecond, Max: 200 * time.Millisecond},
		GroupCommit: delayq.GroupCommit{MaxTasks: group},
	}
}

func relayConfig(log *slog.Logger) relay.Config {
	return relay.Config{
		BatchSize: 50, PollInterval: time.Second, RoundTimeout: 10 * time.Second,
		ReapInterval: reapInterval, Retention: -1, StatsInterval: -1,
		BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond, Logger: log,
		LossCheckInterval: 100 * time.Millisecond, LeaderRetry: 500 * time.Millisecond,
	}
}

// effectHandler writes the task's effect in the worker's transaction: a row
// with the Redis-clock due and claim times and the worker's local time. Tasks
// with the failing payload fail instead.
func effectHandler(name string) func(context.Context, pgx.Tx, *delayq.Task) error {
	return func(ctx context.Context, tx pgx.Tx, t *delayq.Task) error {
		local := time.Now()
		if string(t.Payload) == payloadFail {
			return errInjected
		}
		if _, err := tx.Exec(ctx, sqlInsertEffect, t.Queue, t.ID, t.Attempt, t.Version, name, t.Due, t.ClaimedAt, local); err != nil {
			return err
		}
		// Hold the effect uncommitted a little, so that a fault has a window to
		// land between the write and the commit.
		d := time.Duration(rand.IntN(15)) * time.Millisecond
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-tm.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// runWorker runs a worker in this process until the test ends.
func (s *system) runWorker(name string, hooks ...redis.Hook) {
	t := s.t
	pool := testenv.Pool(t, withParam(t, s.pgURL, "pool_max_conns", fmt.Sprint(workerConc*len(s.queues)+2)))
	dq := s.delayqClient(t, s.redisURL, hooks...)
	w, err := clientkit.NewClient(pool, dq, s.ob, workerConfig(s.logger(name)))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range s.queues {
		if err := w.HandleTx(q, effectHandler(name), queueConfig(s.groupCommit)); err != nil {
			t.Fatal(err)
		}
	}
	s.run(name, w.Run)
}

// runRelay runs a relay in this process until the test ends.
func (s *system) runRelay(name string) { s.runRelayConfig(name, relayConfig(s.logger(name))) }

// runRelayConfig runs a relay of cfg in this process until the test ends.
func (s *system) runRelayConfig(name string, cfg relay.Config) {
	t := s.t
	pool := testenv.Pool(t, withParam(t, s.pgURL, "pool_max_conns", "4"))
	r, err := relay.New(pool, s.delayqClient(t, s.redisURL).AsRedis(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.run(name, r.Run)
}

// run calls f in a goroutine until the test ends (cleanups run before the pools
// close).
func (s *system) run(name string, f func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := f(ctx); err != nil {
			s.t.Errorf("%s: Run: %v", name, err)
		}
	}()
	s.t.Cleanup(func() { cancel(); <-done })
}

// pause waits d or until ctx ends; false when ctx ended. Fault timing only.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// between is a random duration in [lo, hi).
func between(lo, hi time.Duration) time.Duration {
	return lo + rand.N(hi-lo)
}

// withParam returns the URL u with the query parameter k=v.
func withParam(t testing.TB, u, k, v string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	q := p.Query()
	q.Set(k, v)
	p.RawQuery = q.Encode()
	return p.String()
}

// syncBuffer collects log output from many goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
