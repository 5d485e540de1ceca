package delayq

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// bundle is one test's servers and clients: a database of its own (with an effects
// table for handlers to write to) and a Redis prefix of its own.
type bundle struct {
	url    string
	pool   *pgxpool.Pool
	rdb    *redis.Client
	prefix string
	dq     *dispatch.Client
	ob     *outbox.Client
}

func setup(t *testing.T) *bundle {
	t.Helper()
	url := testenv.PostgresURL(t)
	pool := testenv.Pool(t, url)
	rdb, prefix := testenv.Redis(t)
	// Reaped tasks are due again after 1ms, so takeovers in tests need no waiting.
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix, ReapBackoffBase: time.Millisecond, ReapBackoffMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(),
		`CREATE TABLE effects (task_id text NOT NULL, attempt int NOT NULL, worker text NOT NULL DEFAULT '')`); err != nil {
		t.Fatal(err)
	}
	return &bundle{url: url, pool: pool, rdb: rdb, prefix: prefix, dq: dq, ob: ob}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// enqueue does what a producer and the relay do: insert the tasks into the outbox
// (committed), put them into Redis, mark them queued.
func (b *bundle) enqueue(t testing.TB, tasks ...outbox.Task) {
	t.Helper()
	ctx := context.Background()
	for start := 0; start < len(tasks); start += 1000 {
		batch := tasks[start:min(start+1000, len(tasks))]
		res, err := b.ob.EnqueueMany(ctx, b.pool, batch)
		if err != nil {
			t.Fatalf("outbox enqueue: %v", err)
		}
		byQueue := map[string][]dispatch.Task{}
		var ids, queues []string
		for i, tk := range batch {
			if res.Results[i].Duplicate {
				t.Fatalf("duplicate %s/%s", tk.Queue, tk.ID)
			}
			byQueue[tk.Queue] = append(byQueue[tk.Queue], dispatch.Task{
				ID: tk.ID, Payload: tk.Payload, RunAt: res.Results[i].RunAt,
				MaxAttempts: max(tk.MaxAttempts, 0), Version: 1, Key: tk.ConcurrencyKey,
			})
			ids, queues = append(ids, tk.ID), append(queues, tk.Queue)
		}
		for q, ts := range byQueue {
			if _, err := b.dq.Enqueue(ctx, q, ts...); err != nil {
				t.Fatalf("delayq enqueue: %v", err)
			}
		}
		if _, err := b.pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'queued', queued_at = now()
			FROM unnest($1::text[], $2::text[]) AS u(q, id)
			WHERE queue = u.q AND task_id = u.id AND state = 'pending'`, queues, ids); err != nil {
			t.Fatal(err)
		}
	}
}

func task(queue, id string) outbox.Task {
	return outbox.Task{Queue: queue, ID: id, Payload: []byte("p-" + id)}
}

// row is an outbox row as the tests check it.
type row struct {
	state, lastError string
	attempt          int
	payload          []byte
}

func (b *bundle) row(t testing.TB, queue, id string) row {
	t.Helper()
	var r row
	if err := b.pool.QueryRow(context.Background(),
		`SELECT state, COALESCE(last_error, ''), attempt, payload FROM delayq_outbox WHERE queue = $1 AND task_id = $2`,
		queue, id).Scan(&r.state, &r.lastError, &r.attempt, &r.payload); err != nil {
		t.Fatalf("outbox row %s/%s: %v", queue, id, err)
	}
	return r
}

func (b *bundle) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (b *bundle) info(t testing.TB, queue, id string) dispatch.TaskInfo {
	t.Helper()
	ti, err := b.dq.Inspect(context.Background(), queue, id)
	if err != nil {
		t.Fatal(err)
	}
	return ti[0]
}

// reaper runs the relay's lease reaper on queue every 10ms until the test ends.
func (b *bundle) reaper(t *testing.T, queue string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tk := time.NewTicker(10 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
			if _, err := b.dq.Reap(ctx, queue, 100); err != nil && ctx.Err() == nil {
				t.Errorf("reap: %v", err)
				return
			}
		}
	}()
}

// reapOnce runs the relay's lease reaper on queue until it takes id's lease
// back: the lease expired by Redis's clock, whatever the machine's load.
func (b *bundle) reapOnce(t *testing.T, queue, id string) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	for {
		res, err := b.dq.Reap(ctx, queue, 100)
		if err != nil {
			t.Fatalf("reap: %v", err)
		}
		if slices.Contains(res.Requeued, id) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the reaper never took %s's lease back", id)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// finish is one run's end, as the finished hook reports it.
type finish struct {
	task Task
	out  outcome
}

// harness is a running Worker with its finished runs on a channel.
type harness struct {
	w      *worker
	done   chan finish
	stop   func() // cancels Run and waits for it
	logs   *syncBuffer
	cancel context.CancelFunc
	ran    chan struct{} // closed when Run returned
}

// start makes a Worker on b with cfg, lets register add handlers, and runs it until
// the test ends (or stop).
func (b *bundle) start(t *testing.T, cfg WorkerConfig, register func(w *worker)) *harness {
	t.Helper()
	return b.startOn(t, b.pool, cfg, register)
}

func (b *bundle) startOn(t *testing.T, pool *pgxpool.Pool, cfg WorkerConfig, register func(w *worker)) *harness {
	t.Helper()
	h := &harness{done: make(chan finish, 20000), logs: &syncBuffer{}, ran: make(chan struct{})}
	if cfg.Logger == nil {
		cfg.Logger = newLogger(h.logs)
	}
	w, err := newWorker(pool, b.dq, b.ob, cfg)
	if err != nil {
		t.Fatal(err)
	}
	register(w)
	prev := w.hooks.finished
	w.hooks.finished = func(tk *Task, o outcome) {
		if prev != nil {
			prev(tk, o)
		}
		h.done <- finish{task: *tk, out: o}
	}
	h.w = w
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() {
		defer close(h.ran)
		if err := w.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	var once sync.Once
	h.stop = func() { once.Do(func() { cancel(); <-h.ran }) }
	t.Cleanup(h.stop)
	return h
}

// next waits for the next finished run.
func (h *harness) next(t *testing.T) finish {
	t.Helper()
	select {
	case f := <-h.done:
		return f
	case <-time.After(60 * time.Second):
		t.Fatalf("no run finished within 60s; stats %+v; log:\n%s", h.w.Stats(), h.logs)
		return finish{}
	}
}

// expect waits for the next finished run and checks its outcome.
func (h *harness) expect(t *testing.T, id string, o outcome) finish {
	t.Helper()
	f := h.next(t)
	if f.task.ID != id || f.out != o {
		t.Fatalf("run of %s ended %q, want %s %q; log:\n%s", f.task.ID, f.out, id, o, h.logs)
	}
	return f
}

// insertEffect is the transactional handlers' effect.
func insertEffect(ctx context.Context, q outbox.Querier, t *Task, worker string) error {
	_, err := q.Exec(ctx, `INSERT INTO effects (task_id, attempt, worker) VALUES ($1, $2, $3)`, t.ID, t.Attempt, worker)
	return err
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	return out
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

func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func mustContain(t *testing.T, what, s, sub string) {
	t.Helper()
	if !strings.Contains(s, sub) {
		t.Errorf("%s %q does not contain %q", what, s, sub)
	}
}
