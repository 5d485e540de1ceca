package delayq

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/downlog"
)

func TestConfigDefaultsAndValidation(t *testing.T) {
	t.Parallel()
	c := WorkerConfig{}.WithDefaults()
	if c.Lease != 5*time.Second || c.HeartbeatInterval != 5*time.Second/3 || c.ShutdownTimeout != 30*time.Second ||
		c.OpTimeout != 10*time.Second || c.ErrorPause != time.Second || c.DeadHookSweep != time.Minute || c.Logger == nil {
		t.Errorf("defaults %+v", c)
	}
	if c := (WorkerConfig{Lease: 3 * time.Second}).WithDefaults(); c.HeartbeatInterval != time.Second {
		t.Errorf("heartbeat default for a 3s lease: %v", c.HeartbeatInterval)
	}
	for _, bad := range []WorkerConfig{
		{Lease: time.Microsecond},
		{Lease: time.Second, HeartbeatInterval: time.Second},
		{HeartbeatInterval: time.Microsecond},
		{ShutdownTimeout: -2},
		{OpTimeout: -1},
		{DeadHookSweep: -2}, {DeadHookSweep: time.Microsecond},
	} {
		if err := bad.WithDefaults().validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", bad, err)
		}
	}
	for _, ok := range []WorkerConfig{{HeartbeatInterval: -1}, {ShutdownTimeout: -1}, {DeadHookSweep: -1}} {
		if err := ok.WithDefaults().validate(); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
	q := QueueConfig{}.WithDefaults()
	if q.Concurrency != 10 || q.Backoff.Base != time.Second || q.Backoff.Max != time.Hour || q.MaxAttempts != 0 ||
		q.GroupCommit != (GroupCommit{}) {
		t.Errorf("queue defaults %+v", q)
	}
	if g := (QueueConfig{GroupCommit: GroupCommit{MaxTasks: 64}}).WithDefaults().GroupCommit; g.MaxWait != 2*time.Millisecond {
		t.Errorf("group commit defaults %+v", g)
	}
	for _, bad := range []QueueConfig{
		{Concurrency: -1}, {Concurrency: 1001}, {MaxAttempts: -1},
		{GroupCommit: GroupCommit{MaxTasks: -1}}, {GroupCommit: GroupCommit{MaxTasks: maxGroupTasks + 1}},
		{GroupCommit: GroupCommit{MaxTasks: 8, MaxWait: -time.Millisecond}},
		{Backoff: Backoff{Base: time.Microsecond}}, {Backoff: Backoff{Base: time.Minute, Max: time.Second}},
	} {
		if err := bad.WithDefaults().validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// A failed dead hook's mark waits the time since the death, within the queue's
// backoff, jittered into its upper half; a failing sweep pauses ErrorPause,
// doubled with each failure in a row up to a minute.
func TestSweepPauses(t *testing.T) {
	t.Parallel()
	b := Backoff{Base: 10 * time.Millisecond, Max: time.Second}
	for _, c := range []struct{ since, lo, hi time.Duration }{
		{0, 5 * time.Millisecond, 10 * time.Millisecond},
		{100 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond},
		{time.Hour, 500 * time.Millisecond, time.Second},
	} {
		for range 100 {
			if d := hookRetry(b, c.since); d < c.lo || d > c.hi {
				t.Fatalf("hookRetry(%v) = %v, want %v..%v", c.since, d, c.lo, c.hi)
			}
		}
	}
	cfg := WorkerConfig{ErrorPause: time.Second}.WithDefaults()
	s := &sweeper{w: &worker{cfg: cfg, log: cfg.Logger, pg: downlog.New(cfg.Logger, "worker", "PostgreSQL")}}
	for i, hi := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		if d := s.failed(errors.New("down")); d < hi/2 || d > hi {
			t.Errorf("pause %d: %v, want %v..%v", i, d, hi/2, hi)
		}
	}
	s.fails = 1000
	if d := s.failed(errors.New("down")); d < 30*time.Second || d > time.Minute {
		t.Errorf("pause after many failures: %v, want at most a minute", d)
	}
}

func TestBackoffBounds(t *testing.T) {
	t.Parallel()
	b := Backoff{Base: time.Second, Max: time.Minute}
	for _, c := range []struct {
		attempt int
		lo, hi  time.Duration
	}{
		{0, 500 * time.Millisecond, time.Second},
		{1, 500 * time.Millisecond, time.Second},
		{2, time.Second, 2 * time.Second},
		{6, 16 * time.Second, 32 * time.Second},
		{7, 30 * time.Second, time.Minute},
		{100, 30 * time.Second, time.Minute},
		{1 << 30, 30 * time.Second, time.Minute},
	} {
		lo, hi := b.Bounds(c.attempt)
		if lo != c.lo || hi != c.hi {
			t.Errorf("Bounds(%d) = %v, %v; want %v, %v", c.attempt, lo, hi, c.lo, c.hi)
		}
		for range 100 {
			if d := b.delay(c.attempt); d < lo || d > hi {
				t.Fatalf("Delay(%d) = %v outside [%v, %v]", c.attempt, d, lo, hi)
			}
		}
	}
	if lo, hi := (Backoff{}).Bounds(1); lo != 500*time.Millisecond || hi != time.Second {
		t.Errorf("zero Backoff uses the defaults: %v %v", lo, hi)
	}
}

func TestSteeringErrorTypes(t *testing.T) {
	t.Parallel()
	inner := errors.New("inner")
	var ra *retryAfterError
	if err := fmt.Errorf("wrapped: %w", RetryAfter(time.Minute, inner)); !errors.As(err, &ra) || ra.Delay != time.Minute || !errors.Is(err, inner) {
		t.Errorf("RetryAfter: %v", err)
	}
	var nr *noRetryError
	if err := fmt.Errorf("wrapped: %w", NoRetry(inner)); !errors.As(err, &nr) || !errors.Is(err, inner) || err.Error() != "wrapped: inner" {
		t.Errorf("NoRetry: %v", err)
	}
	if RetryAfter(time.Second, nil).Error() != "retry after 1s" || NoRetry(nil).Error() != "no retry" {
		t.Errorf("nil inner errors")
	}
}

func TestRegistrationAndRunErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := newWorker(nil, b.dq, b.ob, WorkerConfig{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil pool: %v", err)
	}
	w, err := newWorker(b.pool, b.dq, b.ob, WorkerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	finished := make(chan struct{})
	if err := w.Run(context.Background()); !errors.Is(err, ErrNoHandlers) {
		t.Errorf("Run without handlers: %v", err)
	}
	nop := func(context.Context, *Task) error { return nil }
	if err := w.Handle("bad{queue}", nop, QueueConfig{}); !errors.Is(err, ErrInvalidQueue) {
		t.Errorf("bad queue: %v", err)
	}
	if err := w.Handle("q", nil, QueueConfig{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil handler: %v", err)
	}
	if err := w.Handle("q", nop, QueueConfig{Concurrency: -1}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bad queue config: %v", err)
	}
	if err := w.Handle("q", nop, QueueConfig{GroupCommit: GroupCommit{MaxTasks: 8}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("group commit of a plain handler: %v", err)
	}
	if err := w.Handle("q", nop, QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := w.HandleTx("q", nil, QueueConfig{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("second handler: %v", err)
	}
	if err := w.Handle("q", nop, QueueConfig{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("second handler: %v", err)
	}
	// Once a task has run, Run is in progress.
	w.hooks.finished = func(*Task, outcome) { close(finished) }
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- w.Run(ctx) }()
	b.enqueue(t, task("q", "x"))
	<-finished
	if err := w.Handle("r", nop, QueueConfig{}); !errors.Is(err, ErrRunning) {
		t.Errorf("registration while running: %v", err)
	}
	if err := w.Run(ctx); !errors.Is(err, ErrRunning) {
		t.Errorf("second Run: %v", err)
	}
	cancel()
	if err := <-ran; err != nil {
		t.Errorf("Run after cancel: %v", err)
	}
}
