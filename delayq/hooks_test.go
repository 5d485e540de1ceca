package delayq

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

// A snoozed run is not counted, its writes are rolled back, and the task runs
// again after the delay: Postgres holds the new run time, Redis the new score.
func TestSnooze(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.HandleTx("q", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if err := insertEffect(ctx, tx, tk, ""); err != nil {
				return err
			}
			switch {
			case tk.ID == "long":
				return Snooze(time.Hour)
			case tk.ID == "short" && b.count(t, `SELECT count(*) FROM snoozes`) == 0:
				if _, err := b.pool.Exec(ctx, `INSERT INTO snoozes VALUES (1)`); err != nil {
					return err
				}
				return Snooze(50 * time.Millisecond)
			}
			return nil
		}, QueueConfig{MaxAttempts: 1})
	})
	if _, err := b.pool.Exec(context.Background(), `CREATE TABLE snoozes (n int)`); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, task("q", "long"))
	f := h.expect(t, "long", outSnoozed)
	ti := b.info(t, "q", "long")
	if ti.State != dispatch.StateReady || ti.Attempt != 0 {
		t.Errorf("redis after a snooze: %+v", ti)
	}
	if d := ti.Score.Sub(f.task.ClaimedAt); d < time.Hour || d > time.Hour+10*time.Second {
		t.Errorf("due %v after the claim, want an hour", d)
	}
	if n := b.count(t, `SELECT count(*) FROM delayq_outbox WHERE task_id = 'long' AND state = 'queued'
		AND attempt = 0 AND run_at > now() + interval '59 minutes'`); n != 1 {
		t.Errorf("outbox row after a snooze: %+v", b.row(t, "q", "long"))
	}

	// MaxAttempts 1: a snooze does not use the only attempt.
	b.enqueue(t, task("q", "short"))
	first := h.expect(t, "short", outSnoozed)
	second := h.expect(t, "short", outSucceeded)
	if second.task.Attempt != 1 {
		t.Errorf("the run after a snooze is attempt %d", second.task.Attempt)
	}
	if d := second.task.ClaimedAt.Sub(first.task.ClaimedAt); d < 50*time.Millisecond {
		t.Errorf("ran again %v after the snooze", d)
	}
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 1 {
		t.Errorf("%d effects: a snoozed run's writes committed", n)
	}
	if s := h.w.Stats(); s.Snoozed != 2 || s.Failed != 0 {
		t.Errorf("stats %+v", s)
	}
}

// A cancelled run's writes are rolled back and the task is cancelled with the
// reason; a later redelivery is suppressed.
func TestCancelFromHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.HandleTx("q", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if err := insertEffect(ctx, tx, tk, ""); err != nil {
				return err
			}
			return Cancel(errors.New("order deleted"))
		}, QueueConfig{})
		_ = w.Handle("plain", func(context.Context, *Task) error { return Cancel(nil) }, QueueConfig{})
	})
	b.enqueue(t, task("q", "c"), task("plain", "p"))
	for range 2 {
		if f := h.next(t); f.out != outCancelled {
			t.Fatalf("%s ended %s", f.task.ID, f.out)
		}
	}
	if r := b.row(t, "q", "c"); r.state != "cancelled" || r.lastError != "order deleted" || r.attempt != 1 {
		t.Errorf("row %+v", r)
	}
	if r := b.row(t, "plain", "p"); r.state != "cancelled" || r.lastError != "cancelled" {
		t.Errorf("plain row %+v", r)
	}
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 0 {
		t.Errorf("%d effects of a cancelled run", n)
	}
	if ti := b.info(t, "q", "c"); ti.State != dispatch.StateDone && ti.State != dispatch.StateMissing {
		t.Errorf("redis %+v", ti)
	}
	if s := h.w.Stats(); s.Cancelled != 2 || s.Failed != 0 {
		t.Errorf("stats %+v", s)
	}
}

type failureCall struct {
	attempt int
	f       Failure
}

// The retry policy decides delays and the end; the error handler sees every
// failure with the decision; RetryAfter and NoRetry override the policy.
func TestRetryPolicyAndErrorHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	var calls []failureCall
	var policy []int
	errBoom := errors.New("boom")
	h := b.start(t, WorkerConfig{OnError: func(_ context.Context, tk *Task, f Failure) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, failureCall{tk.Attempt, f})
		if tk.ID == "panicky" {
			panic("error handler panics")
		}
	}}, func(w *worker) {
		_ = w.Handle("q", func(_ context.Context, tk *Task) error {
			switch tk.ID {
			case "after":
				return RetryAfter(time.Hour, errBoom)
			case "noretry":
				return NoRetry(errBoom)
			}
			return errBoom
		}, QueueConfig{Retry: func(attempt int, err error) (time.Duration, bool) {
			mu.Lock()
			policy = append(policy, attempt)
			mu.Unlock()
			if !errors.Is(err, errBoom) {
				t.Errorf("policy got %v", err)
			}
			return 0, attempt < 3 // 0: at least 1ms
		}, MaxAttempts: 10})
	})
	b.enqueue(t, task("q", "x"))
	for _, want := range []outcome{outRetried, outRetried, outDead} {
		h.expect(t, "x", want)
	}
	if r := b.row(t, "q", "x"); r.state != "dead" || r.attempt != 3 {
		t.Errorf("row %+v", r)
	}
	mu.Lock()
	if len(calls) != 3 || !calls[2].f.Dead || calls[0].f.Dead || calls[0].f.Delay != time.Millisecond || !errors.Is(calls[1].f.Err, errBoom) {
		t.Errorf("error handler calls %+v", calls)
	}
	if len(policy) != 3 {
		t.Errorf("policy asked for attempts %v", policy)
	}
	calls, policy = nil, nil
	mu.Unlock()

	b.enqueue(t, task("q", "after"))
	f := h.expect(t, "after", outRetried)
	if d := b.info(t, "q", "after").Score.Sub(f.task.ClaimedAt); d < time.Hour-time.Second {
		t.Errorf("RetryAfter: due %v later", d)
	}
	b.enqueue(t, task("q", "noretry"))
	h.expect(t, "noretry", outDead)
	b.enqueue(t, task("q", "panicky"))
	h.expect(t, "panicky", outRetried)
	mu.Lock()
	defer mu.Unlock()
	// (panicky goes on failing meanwhile: only its first failure is certain.)
	if len(policy) < 1 || policy[0] != 1 || len(calls) < 3 || calls[0].f.Delay != time.Hour || !calls[1].f.Dead || calls[2].f.Dead {
		t.Errorf("policy %v, calls %+v", policy, calls)
	}
	mustContain(t, "log", h.logs.String(), "error handler panicked")
}

// The dead hook commits with the death, once; a hook that fails (an error, a
// panic) rolls the death back and the task fails again later, uncounted, until
// a hook succeeds; a handler error that is not final runs no hook.
func TestOnDead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL);
		INSERT INTO orders VALUES ('ok', 'new'), ('flaky', 'new'), ('panics', 'new'), ('exhausted', 'new')`); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	hookRuns := map[string][]int{}
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.HandleTx("pay", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if err := insertEffect(ctx, tx, tk, ""); err != nil {
				return err
			}
			if tk.ID == "exhausted" {
				return errors.New("card declined")
			}
			return NoRetry(errors.New("card declined"))
		}, QueueConfig{Backoff: Backoff{Base: time.Millisecond, Max: time.Millisecond},
			OnDead: func(ctx context.Context, tx pgx.Tx, tk *Task, cause error) error {
				mu.Lock()
				hookRuns[tk.ID] = append(hookRuns[tk.ID], tk.Attempt)
				n := len(hookRuns[tk.ID])
				mu.Unlock()
				if cause.Error() != "card declined" {
					t.Errorf("hook got %v", cause)
				}
				if _, err := tx.Exec(ctx, `UPDATE orders SET status = status || ',payment_failed' WHERE id = $1`, tk.ID); err != nil {
					return err
				}
				switch {
				case tk.ID == "flaky" && n == 1:
					return errors.New("hook failed")
				case tk.ID == "panics" && n == 1:
					panic("hook panicked")
				}
				return nil
			}})
	})
	b.enqueue(t, task("pay", "ok"), task("pay", "flaky"), task("pay", "panics"))
	b.enqueue(t, outbox.Task{Queue: "pay", ID: "exhausted", MaxAttempts: 2})
	deadline := time.Now().Add(time.Minute)
	for b.count(t, `SELECT count(*) FROM delayq_outbox WHERE state = 'dead'`) < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("not every task died; log:\n%s", h.logs)
		}
		h.next(t)
	}
	for _, id := range []string{"ok", "flaky", "panics", "exhausted"} {
		var status string
		if err := b.pool.QueryRow(ctx, `SELECT status FROM orders WHERE id = $1`, id).Scan(&status); err != nil {
			t.Fatal(err)
		}
		if status != "new,payment_failed" {
			t.Errorf("order %s: status %q, want the hook's write once", id, status)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 0 {
		t.Errorf("%d effects of failed runs", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, want := range map[string][]int{"ok": {1}, "flaky": {1, 1}, "panics": {1, 1}, "exhausted": {2}} {
		if got := hookRuns[id]; len(got) != len(want) || got[0] != want[0] || got[len(got)-1] != want[len(want)-1] {
			t.Errorf("hook runs of %s at attempts %v, want %v", id, got, want)
		}
	}
	if r := b.row(t, "pay", "flaky"); r.attempt != 1 || r.lastError != "card declined" {
		t.Errorf("flaky row %+v", r)
	}
	// A run's counters follow its commit, which the count above may see first
	// (a CI run saw InFlight 2 with Dead 2).
	for s := h.w.Stats(); s.InFlight > 0; s = h.w.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("runs still in flight after every task died: stats %+v", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s := h.w.Stats(); s.Dead != 4 || s.DeadHookFailed != 2 {
		t.Errorf("stats %+v", s)
	}
	mustContain(t, "log", h.logs.String(), "the dead hook failed")
}

// TestDeadHookHelperProcess is not a test: it is the worker process that
// TestWorkerKilledInDeadHook and TestOnDeadSweepKilledInHook start and kill. Its
// handler fails for good; its dead hook writes the order's status, says so on
// stdout and waits forever, with the death's (or the sweep's) transaction open.
func TestDeadHookHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "deadhook" {
		t.Skip("helper process for TestWorkerKilledInDeadHook")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(helperPGEnv))
	if err != nil {
		t.Fatal(err)
	}
	opt, err := redis.ParseURL(os.Getenv(helperRedisEnv))
	if err != nil {
		t.Fatal(err)
	}
	dq, err := dispatch.New(redis.NewClient(opt), dispatch.Config{Prefix: os.Getenv(helperPrefixEnv)})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := newWorker(pool, dq, ob, WorkerConfig{Lease: helperLease})
	if err != nil {
		t.Fatal(err)
	}
	_ = w.HandleTx("crash", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
		return NoRetry(errors.New("card declined"))
	}, QueueConfig{OnDead: func(ctx context.Context, tx pgx.Tx, tk *Task, _ error) error {
		if _, err := tx.Exec(ctx, `UPDATE orders SET status = status || ',failed-child' WHERE id = $1`, tk.ID); err != nil {
			return err
		}
		fmt.Printf("HOOK %s %d\n", tk.ID, tk.Attempt)
		select {} // killed here, with the death's transaction open
	}})
	_ = w.Run(ctx)
}

// A worker process killed with SIGKILL inside the dead hook: the death and the
// hook's write die with its transaction; the task is live, its lease expires, and
// the next worker's run records the death with its own hook's write, once.
func TestWorkerKilledInDeadHook(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, 2*time.Minute)
	if _, err := b.pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL);
		INSERT INTO orders VALUES ('x', 'new')`); err != nil {
		t.Fatal(err)
	}
	// Enqueued (and marked queued) before the helper starts: its open death
	// transaction holds the row locked.
	b.enqueue(t, outbox.Task{Queue: "crash", ID: "x", MaxAttempts: 3})
	cmd := exec.Command(os.Args[0], "-test.run=^TestDeadHookHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=deadhook", helperPGEnv+"="+b.url,
		helperRedisEnv+"="+testenv.RedisURL(t), helperPrefixEnv+"="+b.prefix)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	context.AfterFunc(ctx, func() { _ = cmd.Process.Kill() })

	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper process: %v", err)
	}
	if strings.TrimSpace(line) != "HOOK x 1" {
		t.Fatalf("helper process said %q", line)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if r := b.row(t, "crash", "x"); r.state != "queued" {
		t.Fatalf("after the kill the row is %+v, want queued: the death must not commit without its hook", r)
	}

	b.reaper(t, "crash")
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.HandleTx("crash", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			return NoRetry(errors.New("card declined"))
		}, QueueConfig{OnDead: func(ctx context.Context, tx pgx.Tx, tk *Task, _ error) error {
			_, err := tx.Exec(ctx, `UPDATE orders SET status = status || ',failed-parent' WHERE id = $1`, tk.ID)
			return err
		}})
	})
	f := h.expect(t, "x", outDead)
	if f.task.Attempt != 2 {
		t.Errorf("second run: attempt %d, want 2", f.task.Attempt)
	}
	var status string
	if err := b.pool.QueryRow(ctx, `SELECT status FROM orders WHERE id = 'x'`).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "new,failed-parent" {
		t.Errorf("order status %q, want the second hook's write only", status)
	}
	if r := b.row(t, "crash", "x"); r.state != "dead" || r.attempt != 2 {
		t.Errorf("outbox %+v", r)
	}
	if ti := b.info(t, "crash", "x"); ti.State != dispatch.StateDead {
		t.Errorf("redis %+v", ti)
	}
}

// Two workers, many tasks dying at once, a third of the dead hooks failing at
// first: every task is dead, with exactly one committed hook write each.
func TestOnDeadExactlyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE hooked (id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const n = 300
	var mu sync.Mutex
	calls := map[string]int{}
	register := func(w *worker) {
		_ = w.HandleTx("q", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if err := insertEffect(ctx, tx, tk, ""); err != nil {
				return err
			}
			return NoRetry(errors.New("declined"))
		}, QueueConfig{Concurrency: 8, Backoff: Backoff{Base: time.Millisecond, Max: 5 * time.Millisecond},
			OnDead: func(ctx context.Context, tx pgx.Tx, tk *Task, _ error) error {
				if _, err := tx.Exec(ctx, `INSERT INTO hooked VALUES ($1)`, tk.ID); err != nil {
					return err
				}
				mu.Lock()
				calls[tk.ID]++
				first := calls[tk.ID] == 1
				mu.Unlock()
				if first && len(tk.ID)%3 == 0 {
					return errors.New("hook fails once")
				}
				return nil
			}})
	}
	var tasks []outbox.Task
	for i := range n {
		tasks = append(tasks, task("q", fmt.Sprintf("t%d", i)))
	}
	h1 := b.start(t, WorkerConfig{}, register)
	h2 := b.start(t, WorkerConfig{}, register)
	b.enqueue(t, tasks...)
	deadline := time.Now().Add(time.Minute)
	for b.count(t, `SELECT count(*) FROM delayq_outbox WHERE state = 'dead'`) < n {
		if time.Now().After(deadline) {
			t.Fatalf("not every task died: stats %+v %+v", h1.w.Stats(), h2.w.Stats())
		}
		select {
		case <-h1.done:
		case <-h2.done:
		case <-time.After(100 * time.Millisecond):
		}
	}
	if got := b.count(t, `SELECT count(*) FROM hooked`); got != n {
		t.Errorf("%d hook writes for %d deaths", got, n)
	}
	if got := b.count(t, `SELECT count(DISTINCT id) FROM hooked`); got != n {
		t.Errorf("%d tasks with a hook write, want %d", got, n)
	}
	if got := b.count(t, `SELECT count(*) FROM effects`); got != 0 {
		t.Errorf("%d effects of failed runs", got)
	}
	// A run's counters follow its commit, which the count above may see first
	// (a CI run saw 298 of 300, each worker one run in flight).
	for s1, s2 := h1.w.Stats(), h2.w.Stats(); s1.InFlight+s2.InFlight > 0; s1, s2 = h1.w.Stats(), h2.w.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("runs still in flight after every task died: stats %+v %+v", s1, s2)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s1, s2 := h1.w.Stats(), h2.w.Stats(); s1.Dead+s2.Dead != n || s1.DeadHookFailed+s2.DeadHookFailed == 0 {
		t.Errorf("stats %+v %+v", s1, s2)
	}
}
