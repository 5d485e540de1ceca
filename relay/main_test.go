package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// testBundle is one test's servers and clients: a database of its own and a Redis
// prefix of its own (or a Redis server of its own).
type testBundle struct {
	url    string
	pool   *pgxpool.Pool // the producers' pool
	rdb    redis.UniversalClient
	prefix string
	dq     *dispatch.Client
	ob     *outbox.Client
}

func setup(t testing.TB) testBundle {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	return newBundle(t, rdb, prefix)
}

func newBundle(t testing.TB, rdb redis.UniversalClient, prefix string) testBundle {
	t.Helper()
	url := testenv.PostgresURL(t)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return testBundle{url: url, pool: testenv.Pool(t, url), rdb: rdb, prefix: prefix, dq: dq, ob: ob}
}

// running is a relay started by start.
type running struct {
	*relay.Relay
	reg *prometheus.Registry
}

// start creates a relay on a pool of its own (as a separate process would have)
// and runs it until the test ends; Run must then return nil.
func (b testBundle) start(t *testing.T, cfg relay.Config) running {
	t.Helper()
	return b.startDQ(t, b.dq, cfg)
}

func (b testBundle) startDQ(t *testing.T, dq *dispatch.Client, cfg relay.Config) running {
	t.Helper()
	return startOn(t, testenv.Pool(t, b.url), dq, cfg)
}

// startOn runs a relay on pool and dq until the test ends, as start does.
func startOn(t *testing.T, pool *pgxpool.Pool, dq *dispatch.Client, cfg relay.Config) running {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	rl, err := relay.New(pool, dq.AsRedis(), cfg)
	if err != nil {
		t.Fatalf("relay.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v, want nil after cancel", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return within 30s of cancel")
		}
	})
	return running{Relay: rl, reg: reg}
}

// testLogger logs into the test's output.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// logRecorder keeps every log message, for tests that count them.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
	next slog.Handler
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	h.msgs = append(h.msgs, r.Message)
	h.mu.Unlock()
	return h.next.Handle(ctx, r)
}
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecorder) WithGroup(string) slog.Handler      { return h }

func (h *logRecorder) count(substr string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if strings.Contains(m, substr) {
			n++
		}
	}
	return n
}

// metric returns the value of a counter or gauge, the sum over the series whose
// labels include the given name=value pairs.
func (r running) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, kv []string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == kv[i] && lp.GetValue() == kv[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// eventually polls cond every 10ms until it holds, or fails the test after
// timeout with cond's last message.
func eventually(t *testing.T, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", timeout, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// enqueue commits tasks in one producer transaction.
func (b testBundle) enqueue(t *testing.T, tasks ...outbox.Task) {
	t.Helper()
	ctx := ctxT(t)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	res, err := b.ob.EnqueueMany(ctx, tx, tasks)
	if err != nil {
		t.Fatalf("EnqueueMany: %v", err)
	}
	if res.Inserted != len(tasks) {
		t.Fatalf("EnqueueMany: %d inserted of %d", res.Inserted, len(tasks))
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// states counts the outbox rows by state.
func (b testBundle) states(t *testing.T) map[string]int {
	t.Helper()
	rows, err := b.pool.Query(ctxT(t), `SELECT state, count(*) FROM delayq_outbox GROUP BY state`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var (
			s string
			n int
		)
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		out[s] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// state returns the state of one row ("" when there is none).
func (b testBundle) state(t *testing.T, queue, id string) string {
	t.Helper()
	var s string
	err := b.pool.QueryRow(ctxT(t), `SELECT state FROM delayq_outbox WHERE queue = $1 AND task_id = $2`, queue, id).Scan(&s)
	if err != nil && !strings.Contains(err.Error(), "no rows") {
		t.Fatal(err)
	}
	return s
}

// waitStates waits until the outbox has exactly want rows by state.
func (b testBundle) waitStates(t *testing.T, timeout time.Duration, want map[string]int) {
	t.Helper()
	eventually(t, timeout, func() (bool, string) {
		got := b.states(t)
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprintf("states %v, want %v", got, want)
	})
}

// ready returns the ids in a queue's ready ZSET, sorted.
func (b testBundle) ready(t *testing.T, queue string) []string {
	t.Helper()
	k, err := b.dq.Keys(queue)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := b.rdb.ZRange(ctxT(t), k.Ready, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	return ids
}

// info inspects one task in Redis.
func (b testBundle) info(t *testing.T, queue, id string) dispatch.TaskInfo {
	t.Helper()
	ti, err := b.dq.Inspect(ctxT(t), queue, id)
	if err != nil {
		t.Fatal(err)
	}
	return ti[0]
}

// markDone runs the worker's completion guard on its own, as a worker that
// committed would have.
func markDone(t *testing.T, q taskstate.Querier, queue, id string, version int) bool {
	t.Helper()
	ok, err := taskstate.New(taskstate.Config{Schema: taskstate.DefaultSchema}).
		MarkDone(ctxT(t), q, taskstate.Key{Queue: queue, ID: id, Version: version}, false)
	if err != nil {
		t.Fatalf("mark %s/%s done: %v", queue, id, err)
	}
	return ok
}

func task(queue, id string) outbox.Task {
	return outbox.Task{Queue: queue, ID: id, Payload: []byte(`{"n":1}`)}
}
