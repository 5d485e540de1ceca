package bench

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
)

// recovery: a worker process is SIGKILLed 1 s into a 60 s task; how long until
// another worker (default settings, with the relay's reaper at its defaults)
// starts the task again.
func recovery(ctx context.Context, s *session, r *Result) error {
	if s.env.WorkerBinary == "" {
		return errors.New("recovery needs Env.WorkerBinary, a delayq binary to run as the worker process")
	}
	if err := s.fill(ctx, 1, 0); err != nil {
		return err
	}
	stopRelay, err := s.startRelay(ctx)
	if err != nil {
		return err
	}
	defer stopRelay()

	proc := exec.CommandContext(ctx, s.env.WorkerBinary, "worker",
		"--database-url", s.env.DatabaseURL, "--redis-url", s.env.RedisURL,
		"--schema", s.schema, "--prefix", s.prefix, "--queue", "bench",
		"--exec", "sleep 60", "--listen", "")
	if err := proc.Start(); err != nil {
		return err
	}
	defer func() {
		_ = proc.Process.Kill()
		_ = proc.Wait()
	}()
	if err := waitFor(ctx, time.Minute, "the worker process to claim the task", func() (bool, error) {
		st, err := s.dq.Stats(ctx, "bench")
		return st.Active == 1, err
	}); err != nil {
		return err
	}
	time.Sleep(time.Second) // "1 s into the task", the scenario itself
	if err := proc.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	killed := time.Now()

	w, err := clientkit.NewClient(s.pool, s.dq, s.ob, delayq.WorkerConfig{})
	if err != nil {
		return err
	}
	var rerunAt atomic.Int64
	var attempt atomic.Int64
	err = w.Handle("bench", func(_ context.Context, t *delayq.Task) error {
		rerunAt.CompareAndSwap(0, time.Now().UnixNano())
		attempt.Store(int64(t.Attempt))
		return nil
	}, delayq.QueueConfig{})
	if err != nil {
		return err
	}
	stopWorker := s.background(ctx, w.Run)
	defer stopWorker()
	if err := waitFor(ctx, 2*time.Minute, "the task to run again", func() (bool, error) {
		return rerunAt.Load() != 0, nil
	}); err != nil {
		return err
	}
	took := time.Unix(0, rerunAt.Load()).Sub(killed)
	r.add("recovery", took.Seconds(), "s")
	r.Checks = map[string]int64{"second_attempt": attempt.Load()}
	if attempt.Load() != 2 {
		return fmt.Errorf("re-run was attempt %d, want 2", attempt.Load())
	}
	return nil
}
