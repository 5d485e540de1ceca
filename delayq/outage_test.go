package delayq

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// TestRedisOutageLogsOncePerChange: a client running workers and the relay,
// Redis stopped for seconds at its start and started again: each part logs
// one line when it loses Redis and one when it is back, not one per retry,
// queue or loop (the relay's rounds and its mirror of the queue controls, the
// worker's claims); go-redis's own lines go to the log through RedisLogger,
// the failed dials at WARN once. Not parallel: go-redis's logger is global.
func TestRedisOutageLogsOncePerChange(t *testing.T) {
	logs := &syncBuffer{}
	logger := newLogger(logs)
	redis.SetLogger(RedisLogger(logger))
	t.Cleanup(func() { redis.SetLogger(stderrRedisLogger{log.New(os.Stderr, "redis: ", log.LstdFlags)}) })

	own := testenv.OwnRedis(t)
	rdb := testenv.RedisClient(t, own.URL())
	pool := testenv.Pool(t, testenv.PostgresURL(t))
	c, err := New(pool, rdb, Config{Logger: logger, Worker: WorkerConfig{ErrorPause: 50 * time.Millisecond},
		Relay: &relay.Config{PollInterval: 100 * time.Millisecond, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan string, 10)
	for _, q := range []string{"a", "b", "c"} {
		if err := c.Handle(q, func(_ context.Context, t *Task) error { ran <- t.ID; return nil }, QueueConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	ctx := ctxT(t, time.Minute)
	// A queue control for the relay's control loop to mirror every 2 s.
	if _, err := c.Pause(ctx, "paused"); err != nil {
		t.Fatal(err)
	}
	own.Stop() // down before the start, as a service meets it
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	// A task committed during the outage: the relay's rounds fail to move it.
	if _, err := c.Outbox().Enqueue(ctx, pool, outbox.Task{Queue: "a", ID: "during"}); err != nil {
		t.Fatal(err)
	}
	count := func(s string) int { return strings.Count(logs.String(), s) }
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the log:\n%s", logs)
		}
	})
	waitFor(t, "the relay and the worker see Redis down", func() bool {
		return count("relay: Redis unreachable") > 0 && count("worker: Redis unreachable") > 0
	})
	// Seconds of retries: the relay's backoff, the workers' claims of three
	// queues every 50 ms, the control loop's mirror (every 2 s).
	time.Sleep(3 * time.Second) //nolint:forbidigo // the outage lasts; nothing to wait for
	if err := own.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-ran:
		if id != "during" {
			t.Errorf("ran %q", id)
		}
	case <-ctx.Done():
		t.Fatalf("the task committed during the outage did not run:\n%s", logs)
	}
	waitFor(t, "the relay and the worker see Redis back", func() bool {
		return count("relay: Redis reachable again") > 0 && count("worker: Redis reachable again") > 0
	})
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	for _, line := range []string{"relay: Redis unreachable", "relay: Redis reachable again", "worker: Redis unreachable", "worker: Redis reachable again"} {
		if n := count(line); n != 1 {
			t.Errorf("%d lines %q, want 1", n, line)
		}
	}
	for _, line := range []string{`msg="relay: mirror queue controls`, `msg="worker: claim failed`, "level=ERROR", "PostgreSQL unreachable"} {
		if n := count(line); n != 0 {
			t.Errorf("%d lines %q, want none", n, line)
		}
	}
	if n := count("level=WARN msg=\"go-redis:"); n > 1 {
		t.Errorf("%d go-redis lines at WARN, want at most 1", n)
	}
	if n := count("level=DEBUG msg=\"go-redis:"); n == 0 {
		t.Errorf("no go-redis line in the log: its lines are not routed")
	}
}

// stderrRedisLogger is go-redis's default logger again, for the tests after.
type stderrRedisLogger struct{ l *log.Logger }

func (s stderrRedisLogger) Printf(_ context.Context, format string, v ...any) {
	_ = s.l.Output(2, fmt.Sprintf(format, v...))
}

func TestRedisLoggerOncePerOutage(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	l := RedisLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	ctx := context.Background()
	for range 20 {
		l.Printf(ctx, "redis: connection pool: failed to dial after %d attempts: %v", 5, "dial tcp 127.0.0.1:1: connect: connection refused")
	}
	l.Printf(ctx, "redis: %s", "something else")
	s := logs.String()
	if n := strings.Count(s, "level=WARN"); n != 1 {
		t.Errorf("%d WARN lines, want 1:\n%s", n, s)
	}
	if n := strings.Count(s, "level=DEBUG"); n != 20 {
		t.Errorf("%d DEBUG lines, want 20:\n%s", n, s)
	}
	if !strings.Contains(s, `msg="go-redis: connection pool: failed to dial after 5 attempts: dial tcp 127.0.0.1:1: connect: connection refused`) {
		t.Errorf("the line:\n%s", s)
	}
}
