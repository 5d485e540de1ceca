package faults

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/testenv"
)

// Redis flushed twice while the load runs, with two relay processes and no
// operator: the leader detects each loss by its epoch mark and repairs Redis from
// Postgres, and is SIGKILLed in the middle of the repair (both relays are, one
// after the other), so the relay that leads next finds the masters unmarked and
// repairs again at full speed. Every task runs once, none early.
func TestRedisFlushSelfHeals(t *testing.T) {
	t.Parallel()
	own := testenv.OwnRedis(t)
	s := newSystem(t, "redis-flush", testenv.PostgresURL(t), own.URL())
	ctx := s.ctx()
	relays := s.startFleet("relay", 2)
	s.runWorker("worker-a")
	s.runWorker("worker-b")
	l := s.newLoad(loadTasks, loadTime)
	done := l.start(ctx)
	admin := redis.NewClient(&redis.Options{Addr: own.Addr()})
	t.Cleanup(func() { _ = admin.Close() })

	s.waitEffects(ctx, 50)
	flushes, lost := 0, 0
	for range 2 {
		if !pause(ctx, between(1500*time.Millisecond, 2500*time.Millisecond)) {
			break
		}
		lost += s.queuedRows(ctx)
		if err := admin.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		flushes++
		// The leader checks its marks every 100 ms: kill it about when it detects
		// the loss, in the middle of the repair or just after.
		pause(ctx, between(150*time.Millisecond, 400*time.Millisecond))
		for range 2 {
			relays.killRandom()
			pause(ctx, between(50*time.Millisecond, 150*time.Millisecond))
		}
	}
	wait(ctx, done)
	s.check(ctx, l, checkOpts{faults: flushes, redisLost: true})
	if flushes < 2 || lost == 0 {
		t.Errorf("%d flushes, %d queued tasks lost with them: the fault never bit", flushes, lost)
	}
	if n := s.childLogsMatching(`Redis lost data`); n == 0 {
		t.Errorf("no relay detected a loss:\n%s", s.childLogsMatchingText("relay"))
	}
}

// Two relays split by queue (one relays alpha and beta, the other beta and
// gamma: the "one relay per group" of `delayq relay --queues`, with a group they
// share) while Redis is flushed twice under load, without an operator: each
// relay leads the healing of its own queue set, so both repair beta at once,
// and gamma, which only the second relays, is repaired too. Every task runs
// once, none early.
func TestTwoRelaysRepairAtOnce(t *testing.T) {
	t.Parallel()
	own := testenv.OwnRedis(t)
	s := newSystem(t, "two-repairs", testenv.PostgresURL(t), own.URL())
	ctx := s.ctx()
	groups := map[string][]string{"relay-ab": {"alpha", "beta"}, "relay-bc": {"beta", "gamma"}}
	for name, qs := range groups {
		cfg := relayConfig(s.logger(name))
		cfg.Queues = qs
		s.runRelayConfig(name, cfg)
	}
	s.runWorker("worker-a")
	s.runWorker("worker-b")
	l := s.newLoad(loadTasks, loadTime)
	done := l.start(ctx)
	admin := redis.NewClient(&redis.Options{Addr: own.Addr()})
	t.Cleanup(func() { _ = admin.Close() })

	s.waitEffects(ctx, 50)
	flushes, lost := 0, 0
	for range 2 {
		if !pause(ctx, between(1500*time.Millisecond, 2500*time.Millisecond)) {
			break
		}
		lost += s.queuedRows(ctx)
		if err := admin.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		flushes++
	}
	wait(ctx, done)
	s.check(ctx, l, checkOpts{faults: flushes, redisLost: true})
	if flushes < 2 || lost == 0 {
		t.Errorf("%d flushes, %d queued tasks lost with them: the fault never bit", flushes, lost)
	}
	// Both led their set's healing and repaired after each flush.
	for name := range groups {
		if !s.logged(name, "Redis lost data") {
			t.Errorf("%s never detected a loss", name)
		}
	}
}

// logged tells whether an in-process component logged a line containing sub.
func (s *system) logged(component, sub string) bool {
	for _, line := range strings.Split(s.logs.String(), "\n") {
		if strings.Contains(line, "component="+component) && strings.Contains(line, sub) {
			return true
		}
	}
	return false
}

// queuedRows counts the tasks Redis should hold.
func (s *system) queuedRows(ctx context.Context) int {
	var n int
	if err := s.admin.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE state = 'queued'`).Scan(&n); err != nil {
		s.t.Fatal(err)
	}
	return n
}

// childLogsMatching counts the lines of the child processes' logs that contain
// any of subs.
func (s *system) childLogsMatching(subs ...string) int {
	n := 0
	for _, line := range strings.Split(s.childLogsMatchingText(""), "\n") {
		for _, sub := range subs {
			if strings.Contains(line, sub) {
				n++
				break
			}
		}
	}
	return n
}

// childLogsMatchingText is the logs of the child processes whose file name
// contains role ("" for all), concatenated.
func (s *system) childLogsMatchingText(role string) string {
	paths, _ := filepath.Glob(filepath.Join(s.logDir, "*.log"))
	var b strings.Builder
	for _, p := range paths {
		if role != "" && !strings.Contains(filepath.Base(p), role) {
			continue
		}
		data, err := os.ReadFile(p)
		if err == nil {
			b.Write(data)
		}
	}
	return b.String()
}
