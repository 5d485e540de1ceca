package delayq

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/outbox"
)

// A plain handler's completion is recorded in the outbox; it sees the idempotency
// key; ClearPayload empties the payload of done tasks in Postgres only for its
// queue, and Redis drops it in any case.
func TestPlainHandlerCompletionAndClearPayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys := make(chan string, 2)
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		plain := func(ctx context.Context, tk *Task) error {
			if string(tk.Payload) != "p-"+tk.ID {
				t.Errorf("payload %q", tk.Payload)
			}
			keys <- tk.IdempotencyKey()
			return nil
		}
		_ = w.Handle("secret", plain, QueueConfig{ClearPayload: true})
		_ = w.Handle("public", plain, QueueConfig{})
	})
	b.enqueue(t, task("secret", "a"))
	h.expect(t, "a", outSucceeded)
	b.enqueue(t, task("public", "b"))
	h.expect(t, "b", outSucceeded)
	if k1, k2 := <-keys, <-keys; k1 != "secret/a" || k2 != "public/b" {
		t.Errorf("idempotency keys %q, %q", k1, k2)
	}
	if r := b.row(t, "secret", "a"); r.state != "done" || len(r.payload) != 0 {
		t.Errorf("secret/a: %+v, want done with an empty payload", r)
	}
	if r := b.row(t, "public", "b"); r.state != "done" || string(r.payload) != "p-b" {
		t.Errorf("public/b: %+v, want done with its payload", r)
	}
	for _, q := range []string{"secret", "public"} {
		ti, err := b.dq.Inspect(context.Background(), q, map[string]string{"secret": "a", "public": "b"}[q])
		if err != nil || ti[0].State != dispatch.StateMissing {
			t.Errorf("%s in Redis: %+v %v", q, ti, err)
		}
	}
}

// No polling: an idle worker claims a delayed task when it falls due (not before,
// and not a poll interval later), and wakes for an earlier task enqueued while it
// sleeps.
func TestClaimsWhenDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.Handle("due", func(context.Context, *Task) error { return nil }, QueueConfig{})
	})
	ctx := context.Background()
	b.enqueue(t, outbox.Task{Queue: "due", ID: "later", Delay: 20 * time.Second})
	b.enqueue(t, outbox.Task{Queue: "due", ID: "soon", Delay: 500 * time.Millisecond})
	f := h.expect(t, "soon", outSucceeded)
	late := f.task.ClaimedAt.Sub(f.task.Due)
	// Typically a few ms; the bound leaves room for a loaded machine and is still
	// far below the waiter's 30s backstop, so only a wake-up at the due time passes.
	if late < 0 || late > time.Second {
		t.Errorf("claimed %v after due; want within 1s, never before", late)
	}
	if st, err := b.dq.Stats(ctx, "due"); err != nil || st.Ready != 1 {
		t.Errorf("stats %+v %v", st, err)
	}
	if s := h.w.Stats(); s.Claimed != 1 {
		t.Errorf("claimed %d", s.Claimed)
	}
}

// Collectors register on Config.Registerer, are shared by workers on one registry,
// and count.
func TestMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := prometheus.NewRegistry()
	if _, err := newWorker(b.pool, b.dq, b.ob, WorkerConfig{Registerer: reg}); err != nil {
		t.Fatalf("first worker on the registry: %v", err)
	}
	h := b.start(t, WorkerConfig{Registerer: reg}, func(w *worker) {
		_ = w.HandleTx("m", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if tk.ID == "bad" {
				return NoRetry(errors.New("no"))
			}
			return nil
		}, QueueConfig{})
	})
	b.enqueue(t, task("m", "good"))
	h.expect(t, "good", outSucceeded)
	b.enqueue(t, task("m", "bad"))
	h.expect(t, "bad", outDead)
	ev := h.w.obs.(*promObserver).events
	for e, want := range map[string]float64{"claimed": 2, "succeeded": 1, "failed": 1, "dead": 1, "retried": 0} {
		if got := testutil.ToFloat64(ev.WithLabelValues("m", e)); got != want {
			t.Errorf("delayq_worker_tasks_total{outcome=%q} = %v, want %v", e, got, want)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]uint64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if hg := m.GetHistogram(); hg != nil {
				names[mf.GetName()] = hg.GetSampleCount()
			}
		}
	}
	if names["delayq_worker_claim_lateness_seconds"] != 2 || names["delayq_worker_processing_seconds"] != 2 {
		t.Errorf("histogram sample counts %v, want 2 each", names)
	}
}

// A task enqueued into Redis directly, without an outbox row, is a documented
// feature for plain handlers: it runs once and is acknowledged. A transactional
// handler cannot complete it (its guard has no row to commit with): the run is
// suppressed, logged and counted, never silently.
func TestRedisOnlyTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := prometheus.NewRegistry()
	h := b.start(t, WorkerConfig{Registerer: reg}, func(w *worker) {
		_ = w.Handle("plain", func(context.Context, *Task) error { return nil }, QueueConfig{})
		_ = w.HandleTx("tx", func(context.Context, pgx.Tx, *Task) error { return nil }, QueueConfig{})
	})
	ctx := ctxT(t, time.Minute)
	if _, err := b.dq.Enqueue(ctx, "plain", dispatch.Task{ID: "p", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	h.expect(t, "p", outSucceeded)
	if _, err := b.dq.Enqueue(ctx, "tx", dispatch.Task{ID: "t", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	h.expect(t, "t", outSuppressed)
	for q, id := range map[string]string{"plain": "p", "tx": "t"} {
		if ti := b.info(t, q, id); ti.State != dispatch.StateMissing {
			t.Errorf("%s/%s in Redis: %+v, want acknowledged", q, id, ti)
		}
	}
	ev := h.w.obs.(*promObserver).events
	if got := testutil.ToFloat64(ev.WithLabelValues("tx", "suppressed_duplicate")); got != 1 {
		t.Errorf("suppressed counted %v times, want 1", got)
	}
	if got := testutil.ToFloat64(ev.WithLabelValues("plain", "succeeded")); got != 1 {
		t.Errorf("plain succeeded counted %v times, want 1", got)
	}
	if logs := h.logs.String(); !strings.Contains(logs, `level=INFO msg="worker: run suppressed, its effect rolled back" queue=tx id=t`) ||
		!strings.Contains(logs, "a transactional handler needs the outbox") {
		t.Errorf("no Info line with the reason:\n%s", logs)
	}
}

// A failure records its next run time in Postgres too, so a Redis rebuilt from
// Postgres (reconcile after a loss) keeps the backoff instead of running the task
// at once.
func TestFailureRecordsNextRunTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.Handle("f", func(context.Context, *Task) error {
			return RetryAfter(30*time.Minute, errors.New("provider down"))
		}, QueueConfig{})
	})
	b.enqueue(t, task("f", "x"))
	before := time.Now()
	h.expect(t, "x", outRetried)
	var runAt time.Time
	if err := b.pool.QueryRow(context.Background(),
		`SELECT run_at FROM delayq_outbox WHERE queue = 'f' AND task_id = 'x'`).Scan(&runAt); err != nil {
		t.Fatal(err)
	}
	if lo, hi := before.Add(30*time.Minute-time.Second), time.Now().Add(30*time.Minute+time.Second); runAt.Before(lo) || runAt.After(hi) {
		t.Errorf("run_at %v after a RetryAfter(30m) failure, want about %v", runAt, before.Add(30*time.Minute))
	}
	if ti := b.info(t, "f", "x"); ti.State != dispatch.StateReady || ti.Score.Sub(runAt).Abs() > 2*time.Second {
		t.Errorf("Redis %+v, Postgres run_at %v: the two stores disagree on the next run", ti, runAt)
	}
}
