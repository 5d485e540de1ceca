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

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// startRelay runs a relay (its rounds and its reaper) for queues on a pool of
// its own until the test ends.
func (b *bundle) startRelay(t *testing.T, queues ...string) {
	t.Helper()
	rl, err := relay.New(testenv.Pool(t, b.url), b.dq.AsRedis(), relay.Config{
		Queues: queues, ReapInterval: 20 * time.Millisecond, Logger: newLogger(&syncBuffer{}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay Run: %v", err)
		}
	})
}

// insertInvalid writes a row no Redis key can hold (an id with a space), by hand as
// an older version might have, and wakes the relay, which sets it dead.
func (b *bundle) insertInvalid(t *testing.T, queue, id string) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), fmt.Sprintf(`INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts)
		VALUES ('%s', '%s', now(), '\x00', 1); SELECT pg_notify('delayq_outbox', '%s')`, queue, id, queue)); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds or a minute passed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// hookRecorder is an OnDead hook that writes a row per call into hooked (in the
// hook's transaction) and fails the first call of the ids in failFirst.
type hookRecorder struct {
	t         *testing.T
	failFirst map[string]bool
	mu        sync.Mutex
	calls     map[string][]int // versions, per id
}

func (h *hookRecorder) hook(ctx context.Context, tx pgx.Tx, tk *Task, cause error) error {
	if !errors.Is(cause, ErrDeathWithoutHook) {
		h.t.Errorf("%s: hook cause %v, want a DeferredDeathError", tk.ID, cause)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO hooked VALUES ($1)`, tk.ID); err != nil {
		return err
	}
	h.mu.Lock()
	h.calls[tk.ID] = append(h.calls[tk.ID], tk.Version)
	first := len(h.calls[tk.ID]) == 1
	h.mu.Unlock()
	if first && h.failFirst[tk.ID] {
		return errors.New("hook fails once")
	}
	return nil
}

// A worker process SIGKILLed on its tasks' last attempt: the relay's reaper
// records them dead, and a row Redis refuses is recorded dead by the relay. Two
// other workers serve the queue with an OnDead hook that fails the first time
// for some: each death's hook commits exactly once, woken by the death's
// notification (no backstop sweep).
func TestOnDeadAfterWorkerKilledOnLastAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, 2*time.Minute)
	if _, err := b.pool.Exec(ctx, `CREATE TABLE hooked (id text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	// The helper of TestWorkerProcessKilledMidHandler: its handler writes, says
	// RUNNING and blocks.
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperPGEnv+"="+b.url,
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

	// As many as the helper's pool has connections (4), each run holding one.
	killed := []string{"x1", "x2", "x3", "x4"}
	var tasks []outbox.Task
	for _, id := range killed {
		tasks = append(tasks, outbox.Task{Queue: "crash", ID: id, Payload: []byte("p"), MaxAttempts: 1})
	}
	b.enqueue(t, tasks...)
	rd := bufio.NewReader(out)
	for range killed {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("helper process: %v", err)
		}
		if !strings.HasPrefix(line, "RUNNING x") || !strings.HasSuffix(line, " 1\n") {
			t.Fatalf("helper process said %q", line)
		}
	}

	rec := &hookRecorder{t: t, failFirst: map[string]bool{"x1": true, "x4": true, "bad id": true}, calls: map[string][]int{}}
	register := func(w *worker) {
		_ = w.HandleTx("crash", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			return insertEffect(ctx, tx, tk, "parent")
		}, QueueConfig{Backoff: Backoff{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond}, OnDead: rec.hook})
	}
	// Two sweeping workers, woken by the deaths' notifications alone.
	h1 := b.start(t, WorkerConfig{DeadHookSweep: -1}, register)
	h2 := b.start(t, WorkerConfig{DeadHookSweep: -1}, register)

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	b.startRelay(t, "crash")
	b.insertInvalid(t, "crash", "bad id")
	all := append(killed, "bad id")

	waitFor(t, "a committed hook write for every death", func() bool {
		return b.count(t, `SELECT count(DISTINCT id) FROM hooked`) == len(all)
	})
	h1.stop()
	h2.stop()
	for _, id := range all {
		if n := b.count(t, `SELECT count(*) FROM hooked WHERE id = $1`, id); n != 1 {
			t.Errorf("%s: %d hook writes committed, want 1", id, n)
		}
		if r := b.row(t, "crash", id); r.state != "dead" || r.attempt != 1 && id != "bad id" {
			t.Errorf("%s: row %+v", id, r)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM delayq_outbox WHERE hook_due IS NOT NULL`); n != 0 {
		t.Errorf("%d marks left after their hooks committed", n)
	}
	mustContain(t, "reaped row", b.row(t, "crash", "x2").lastError, dispatch.LeaseExpiredError)
	mustContain(t, "invalid row", b.row(t, "crash", "bad id").lastError, "Redis cannot hold")
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 0 {
		t.Errorf("%d effects: the killed runs' transactions committed", n)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, id := range all {
		if n := len(rec.calls[id]); n < 1 || n > 1 && !rec.failFirst[id] {
			t.Errorf("%s: hook called %d times", id, n)
		}
	}
	s1, s2 := h1.w.Stats(), h2.w.Stats()
	if s1.SweptDeadHooks+s2.SweptDeadHooks != int64(len(all)) || s1.SweptDeadHookFailed+s2.SweptDeadHookFailed != int64(len(rec.failFirst)) {
		t.Errorf("stats %+v, %+v", s1, s2)
	}
	var lag float64 // from the recorded death to its hook's write, hooks that did not fail
	if err := b.pool.QueryRow(ctx, `SELECT extract(epoch FROM max(h.at - o.done_at)) * 1000 FROM hooked h
		JOIN delayq_outbox o ON o.queue = 'crash' AND o.task_id = h.id WHERE NOT h.id = ANY($1)`,
		[]string{"x1", "x4", "bad id"}).Scan(&lag); err != nil {
		t.Fatal(err)
	}
	t.Logf("hooks run by the two workers: %d and %d; death to hook write at most %.1f ms", s1.SweptDeadHooks, s2.SweptDeadHooks, lag)
}

// A dead row retried by an operator before any sweep ran its hook drops its
// mark: the hook runs once, for the death that stands (the second), never for
// the first. Here the death is the relay's (a row Redis refuses), and the
// worker starts after both deaths: its sweep at start finds the mark.
func TestOnDeadOfRetriedDeathRunsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, 2*time.Minute)
	if _, err := b.pool.Exec(ctx, `CREATE TABLE hooked (id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	b.startRelay(t, "inv")
	b.insertInvalid(t, "inv", "bad id")
	waitFor(t, "the invalid row dead", func() bool {
		return b.count(t, `SELECT count(*) FROM delayq_outbox WHERE state = 'dead' AND hook_due IS NOT NULL`) == 1
	})
	if n, err := reconcile.RetryAllDead(ctx, b.pool, reconcile.Options{Queues: []string{"inv"}}); err != nil || n != 1 {
		t.Fatalf("retry: %d, %v", n, err)
	}
	waitFor(t, "the retried row dead again", func() bool {
		return b.count(t, `SELECT count(*) FROM delayq_outbox WHERE state = 'dead' AND version = 2 AND hook_due IS NOT NULL`) == 1
	})

	rec := &hookRecorder{t: t, calls: map[string][]int{}}
	h := b.start(t, WorkerConfig{DeadHookSweep: -1}, func(w *worker) {
		_ = w.HandleTx("inv", func(context.Context, pgx.Tx, *Task) error { return nil }, QueueConfig{OnDead: rec.hook})
	})
	waitFor(t, "the hook's write", func() bool { return b.count(t, `SELECT count(*) FROM hooked`) == 1 })
	h.stop()
	if n := b.count(t, `SELECT count(*) FROM hooked`); n != 1 {
		t.Errorf("%d hook writes, want 1", n)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if got := rec.calls["bad id"]; len(got) != 1 || got[0] != 2 {
		t.Errorf("hook ran for versions %v, want [2]", got)
	}
}

// A worker process SIGKILLed inside a hook its sweep runs (the helper of
// TestWorkerKilledInDeadHook: its hook writes, says HOOK and blocks, with the
// sweep's transaction open): neither the hook's write nor the clearing of the
// mark commits, and the next worker's sweep runs its own hook, once.
func TestOnDeadSweepKilledInHook(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, 2*time.Minute)
	if _, err := b.pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL);
		INSERT INTO orders VALUES ('bad id', 'new')`); err != nil {
		t.Fatal(err)
	}
	b.startRelay(t, "crash")
	b.insertInvalid(t, "crash", "bad id")
	waitFor(t, "the invalid row dead and marked", func() bool {
		return b.count(t, `SELECT count(*) FROM delayq_outbox WHERE state = 'dead' AND hook_due IS NOT NULL`) == 1
	})

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
	if strings.TrimSpace(line) != "HOOK bad id 0" { // never run: attempt 0
		t.Fatalf("helper process said %q", line)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if n := b.count(t, `SELECT count(*) FROM orders WHERE status = 'new'`); n != 1 {
		t.Fatal("the killed hook's write committed")
	}

	h := b.start(t, WorkerConfig{DeadHookSweep: -1}, func(w *worker) {
		_ = w.HandleTx("crash", func(context.Context, pgx.Tx, *Task) error { return nil },
			QueueConfig{OnDead: func(ctx context.Context, tx pgx.Tx, tk *Task, _ error) error {
				_, err := tx.Exec(ctx, `UPDATE orders SET status = status || ',failed-parent' WHERE id = $1`, tk.ID)
				return err
			}})
	})
	waitFor(t, "the second worker's hook", func() bool {
		return b.count(t, `SELECT count(*) FROM orders WHERE status <> 'new'`) == 1
	})
	h.stop()
	var status string
	if err := b.pool.QueryRow(ctx, `SELECT status FROM orders`).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "new,failed-parent" {
		t.Errorf("order status %q, want the second hook's write only", status)
	}
	if n := b.count(t, `SELECT count(*) FROM delayq_outbox WHERE hook_due IS NOT NULL`); n != 0 {
		t.Errorf("%d marks left", n)
	}
	if s := h.w.Stats(); s.SweptDeadHooks != 1 {
		t.Errorf("stats %+v", s)
	}
}
