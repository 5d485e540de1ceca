package delayq

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
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

// Environment of the helper process of TestWorkerProcessKilledMidHandler.
const (
	helperEnv       = "DELAYQ_WORKER_TEST_HELPER"
	helperPGEnv     = "DELAYQ_WORKER_TEST_PG"
	helperRedisEnv  = "DELAYQ_WORKER_TEST_REDIS"
	helperPrefixEnv = "DELAYQ_WORKER_TEST_PREFIX"
	helperGroupEnv  = "DELAYQ_WORKER_TEST_GROUP" // "1": group commit, TestWorkerProcessKilledMidGroup
	helperLease     = time.Second
)

// TestHelperProcess is not a test: it is the worker process that
// TestWorkerProcessKilledMidHandler starts (this test binary, re-executed) and
// kills. It runs a worker whose handler writes its effect, says so on stdout and
// waits forever.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process for TestWorkerProcessKilledMidHandler")
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
	if os.Getenv(helperGroupEnv) == "1" {
		_ = w.HandleTx("crash", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if err := insertEffect(ctx, tx, tk, "child"); err != nil {
				return err
			}
			fmt.Printf("RAN %s %d\n", tk.ID, tk.Attempt)
			if tk.ID == "x3" {
				select {} // killed here, the runs before released from their savepoints
			}
			return nil
		}, groupOf(5))
	} else {
		_ = w.HandleTx("crash", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if err := insertEffect(ctx, tx, tk, "child"); err != nil {
				return err
			}
			fmt.Printf("RUNNING %s %d\n", tk.ID, tk.Attempt)
			select {} // killed here, with the transaction open
		}, QueueConfig{})
	}
	_ = w.Run(ctx)
}

// A worker process killed with SIGKILL in the middle of a handler: its
// transaction dies with it; the task runs again after the lease plus one reap
// interval and its effect appears once. The worker registry shows the process
// lost, with the run it had.
func TestWorkerProcessKilledMidHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, 2*time.Minute)
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
	context.AfterFunc(ctx, func() { _ = cmd.Process.Kill() }) // a stuck helper fails the read below

	b.enqueue(t, task("crash", "x"))
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper process: %v", err)
	}
	if strings.TrimSpace(line) != "RUNNING x 1" {
		t.Fatalf("helper process said %q", line)
	}
	// The worker registry lists the process running x (from its next beat),
	// then, killed without a goodbye, as lost a lease after its last beat.
	registered := func(lost bool) func() bool {
		return func() bool {
			for _, w := range b.workers(t) {
				if w.PID == cmd.Process.Pid && w.Lost == lost && len(w.Running) == 1 && w.Running[0].ID == "x" && w.Queues["crash"] == 10 {
					return true
				}
			}
			return false
		}
	}
	waitFor(t, "the helper process listed running x", registered(false))
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	waitFor(t, "the killed process listed as lost", registered(true))
	// The lease the dead process held (renewed by its heartbeats until the kill).
	leaseUntil := b.info(t, "crash", "x").Score
	if leaseUntil.IsZero() {
		t.Fatal("the task is not active after the kill")
	}

	b.reaper(t, "crash")
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.HandleTx("crash", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			return insertEffect(ctx, tx, tk, "parent")
		}, QueueConfig{})
	})
	f := h.expect(t, "x", outSucceeded)
	if f.task.Attempt != 2 {
		t.Errorf("second run: attempt %d, want 2", f.task.Attempt)
	}
	if f.task.ClaimedAt.Before(leaseUntil) {
		t.Errorf("second run claimed at %v, before the dead worker's lease ended at %v", f.task.ClaimedAt, leaseUntil)
	}
	if late := f.task.ClaimedAt.Sub(leaseUntil); late > 5*time.Second {
		t.Errorf("second run claimed %v after the lease ended", late)
	}
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM effects WHERE worker = 'parent'`); n != 1 {
		t.Errorf("the effect is not the second run's")
	}
	if r := b.row(t, "crash", "x"); r.state != "done" {
		t.Errorf("outbox %+v", r)
	}
}

// A worker process killed with SIGKILL in the middle of a group, between
// savepoints: two runs of the group have released theirs, the third runs. None of
// the group commits; every task runs again after its lease and has one effect.
func TestWorkerProcessKilledMidGroup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, 2*time.Minute)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperGroupEnv+"=1", helperPGEnv+"="+b.url,
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

	ids := []string{"x1", "x2", "x3", "x4", "x5"}
	var tasks []outbox.Task
	for _, id := range ids {
		tasks = append(tasks, task("crash", id))
	}
	b.enqueue(t, tasks...) // one statement: one due time, so claimed in id order
	rd := bufio.NewReader(out)
	for _, want := range []string{"RAN x1 1", "RAN x2 1", "RAN x3 1"} {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("helper process: %v", err)
		}
		if strings.TrimSpace(line) != want {
			t.Fatalf("helper process said %q, want %q", line, want)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 0 {
		t.Fatalf("%d effects of a group killed before its commit", n)
	}
	if n := b.count(t, `SELECT count(*) FROM delayq_outbox WHERE state = 'queued'`); n != len(ids) {
		t.Fatalf("%d rows queued after the kill, want %d", n, len(ids))
	}

	b.reaper(t, "crash")
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.HandleTx("crash", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			return insertEffect(ctx, tx, tk, "parent")
		}, groupOf(len(ids)))
	})
	for range ids {
		f := h.next(t)
		if f.out != outSucceeded || f.task.Attempt != 2 {
			t.Errorf("%s: %s at attempt %d, want succeeded at 2", f.task.ID, f.out, f.task.Attempt)
		}
	}
	for _, id := range ids {
		if n := b.count(t, `SELECT count(*) FROM effects WHERE task_id = $1 AND worker = 'parent'`, id); n != 1 {
			t.Errorf("%s: %d effects of the second run, want 1", id, n)
		}
		if r := b.row(t, "crash", id); r.state != "done" {
			t.Errorf("%s: %+v", id, r)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM effects`); n != len(ids) {
		t.Errorf("%d effects, want %d", n, len(ids))
	}
}
