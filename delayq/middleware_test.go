package delayq

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/outbox"
)

type ctxKey struct{}

// recorder is a middleware that records its calls, and passes a context value on.
type recorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, s)
}

func (r *recorder) mw(name string) Middleware {
	return func(ctx context.Context, t *Task, next Next) error {
		r.add(name + ">" + t.ID)
		v, _ := ctx.Value(ctxKey{}).(string)
		err := next(context.WithValue(ctx, ctxKey{}, v+name))
		r.add(name + "<" + t.ID)
		return err
	}
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.calls, " ")
}

// Worker middleware wraps queue middleware, both wrap plain and transactional
// handlers, pass contexts on, and an error a middleware returns fails the run and
// rolls back what the handler wrote.
func TestMiddleware(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{}
	veto := func(ctx context.Context, t *Task, next Next) error {
		if err := next(ctx); err != nil || t.ID != "vetoed" {
			return err
		}
		return NoRetry(errors.New("vetoed by middleware"))
	}
	h := b.start(t, WorkerConfig{Middleware: []Middleware{rec.mw("W")}}, func(w *worker) {
		_ = w.HandleTx("tx", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			rec.add("tx:" + ctx.Value(ctxKey{}).(string))
			return insertEffect(ctx, tx, tk, "")
		}, QueueConfig{Middleware: []Middleware{rec.mw("Q"), veto}})
		_ = w.Handle("plain", func(ctx context.Context, tk *Task) error {
			rec.add("plain:" + ctx.Value(ctxKey{}).(string))
			return nil
		}, QueueConfig{})
	})
	b.enqueue(t, task("tx", "a"))
	h.expect(t, "a", outSucceeded)
	b.enqueue(t, task("plain", "b"))
	h.expect(t, "b", outSucceeded)
	if got, want := rec.String(), "W>a Q>a tx:WQ Q<a W<a W>b plain:W W<b"; got != want {
		t.Errorf("calls %q, want %q", got, want)
	}
	b.enqueue(t, task("tx", "vetoed"))
	h.expect(t, "vetoed", outDead)
	if r := b.row(t, "tx", "vetoed"); r.state != "dead" || r.lastError != "vetoed by middleware" {
		t.Errorf("vetoed row %+v", r)
	}
	if n := b.count(t, `SELECT count(*) FROM effects WHERE task_id = 'vetoed'`); n != 0 {
		t.Errorf("a vetoed run committed %d effects", n)
	}
	if n := b.count(t, `SELECT count(*) FROM effects WHERE task_id = 'a'`); n != 1 {
		t.Errorf("%d effects of a", n)
	}
}

// A panic in a middleware is recovered by the worker's Recover, which is outside
// every middleware: the run fails, the stack goes to the log only.
func TestMiddlewarePanic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	boom := func(ctx context.Context, t *Task, next Next) error { panic("middleware boom") }
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.Handle("q", func(context.Context, *Task) error { return nil },
			QueueConfig{Middleware: []Middleware{boom}, Backoff: Backoff{Base: time.Hour}})
	})
	b.enqueue(t, task("q", "p"))
	h.expect(t, "p", outRetried)
	if r := b.row(t, "q", "p"); r.lastError != "panic: middleware boom" {
		t.Errorf("last error %q", r.lastError)
	}
	mustContain(t, "log", h.logs.String(), "middleware_test.go")
}

// Timeout cancels the handler's context with ErrTimeout, and the failure says so.
func TestTimeoutMiddleware(t *testing.T) {
	t.Parallel()
	b := setup(t)
	causes := make(chan error, 1)
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.HandleTx("q", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			// The effect is written whatever the 20ms left by then (under load the
			// insert alone can outlast them), so the run always ends at the
			// timeout's wait below, with the timeout's cause.
			if err := insertEffect(context.WithoutCancel(ctx), tx, tk, ""); err != nil {
				return err
			}
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return ctx.Err()
		}, QueueConfig{Middleware: []Middleware{Timeout(20 * time.Millisecond)}, Backoff: Backoff{Base: time.Hour}})
	})
	b.enqueue(t, task("q", "slow"))
	h.expect(t, "slow", outRetried)
	if c := <-causes; !errors.Is(c, ErrTimeout) {
		t.Errorf("cause %v", c)
	}
	r := b.row(t, "q", "slow")
	mustContain(t, "last error", r.lastError, "handler timed out after 20ms: context deadline exceeded")
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 0 {
		t.Errorf("%d effects of a timed out run", n)
	}
}

// Logging logs successes at Debug and failures at Info.
func TestLoggingMiddleware(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logs := &syncBuffer{}
	h := b.start(t, WorkerConfig{Middleware: []Middleware{Logging(newLogger(logs))}}, func(w *worker) {
		_ = w.Handle("q", func(_ context.Context, tk *Task) error {
			if tk.ID == "bad" {
				return NoRetry(errors.New("bad task"))
			}
			return nil
		}, QueueConfig{})
	})
	b.enqueue(t, task("q", "good"))
	h.expect(t, "good", outSucceeded)
	b.enqueue(t, task("q", "bad"))
	h.expect(t, "bad", outDead)
	s := logs.String()
	mustContain(t, "log", s, `level=DEBUG msg="worker: run succeeded" queue=q id=good attempt=1`)
	mustContain(t, "log", s, `level=INFO msg="worker: run failed" queue=q id=bad attempt=1`)
	mustContain(t, "log", s, `err="bad task"`)
}

func TestMiddlewareConfig(t *testing.T) {
	t.Parallel()
	if err := (WorkerConfig{Middleware: []Middleware{nil}}).Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil worker middleware: %v", err)
	}
	if err := (QueueConfig{Middleware: []Middleware{Timeout(time.Second), nil}}).Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil queue middleware: %v", err)
	}
}

type order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// Typed handlers get the decoded value; a payload that does not decode makes the
// task dead at its first run, with the reason, and the handler never runs.
func TestTypedHandlers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	orders := outbox.Queue[order]{Name: "orders"}
	notes := outbox.Queue[[]string]{Name: "notes"}
	got := make(chan string, 10)
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		if err := RegisterTx(clientOf(w), orders, func(ctx context.Context, tx pgx.Tx, tk *Task, o order) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (task_id, attempt, worker) VALUES ($1, $2, $3)`, o.ID, o.Amount, "typed")
			return err
		}, QueueConfig{}); err != nil {
			t.Error(err)
		}
		if err := Register(clientOf(w), notes, func(_ context.Context, _ *Task, v []string) error {
			got <- strings.Join(v, ",")
			return nil
		}, QueueConfig{}); err != nil {
			t.Error(err)
		}
		if err := Register[int](clientOf(w), outbox.Queue[int]{Name: "nil"}, nil, QueueConfig{}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("nil typed handler: %v", err)
		}
	})
	ot, err := orders.Task(outbox.Task{ID: "o1"}, order{ID: "o1", Amount: 42})
	if err != nil {
		t.Fatal(err)
	}
	nt, err := notes.Task(outbox.Task{ID: "n1"}, []string{"x", "y"})
	if err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, ot, nt)
	for range 2 {
		h.next(t)
	}
	if n := b.count(t, `SELECT count(*) FROM effects WHERE task_id = 'o1' AND attempt = 42`); n != 1 {
		t.Errorf("%d typed effects", n)
	}
	if v := <-got; v != "x,y" {
		t.Errorf("notes got %q", v)
	}

	b.enqueue(t, outbox.Task{Queue: "orders", ID: "garbled", Payload: []byte(`{"id": 7`), MaxAttempts: 5})
	h.expect(t, "garbled", outDead)
	r := b.row(t, "orders", "garbled")
	if r.state != "dead" || r.attempt != 1 {
		t.Errorf("garbled row %+v", r)
	}
	mustContain(t, "last error", r.lastError, "invalid payload: queue orders: decode delayq.order: unexpected end of JSON input")
	if n := b.count(t, `SELECT count(*) FROM effects WHERE task_id = 'garbled'`); n != 0 {
		t.Errorf("%d effects of a garbled task", n)
	}
}
