package faults

import (
	"testing"
	"time"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/internal/validate"
)

// A rate-limited queue under the load, two workers: every task exactly once (the
// checker), and beta's starts never outrun the limit in any window, by the Redis
// clock of their claims, across both workers; the other queues are not held back.
// The limit is mirrored into Redis by the relay alone (the test writes only
// Postgres), as after a mirror write that failed.
func TestRateLimitedQueue(t *testing.T) {
	t.Parallel()
	s := newSystem(t, "rate-limit", testenv.PostgresURL(t), testenv.OwnRedis(t).URL())
	ctx := s.ctx()
	rate := validate.RateLimit{Limit: 40, Period: time.Second, Burst: 5}
	c, err := taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).SetRateLimit(ctx, s.admin, "beta", rate)
	if err != nil {
		t.Fatal(err)
	}
	s.runRelay("relay")
	s.runWorker("w1")
	s.runWorker("w2")
	k, err := s.dq.Keys("beta")
	if err != nil {
		t.Fatal(err)
	}
	for {
		got, v, err := s.dq.Controls(ctx, "beta")
		if err == nil && v == c.Version && got.Rate == c.Rate {
			break
		}
		if !pause(ctx, 20*time.Millisecond) {
			t.Fatalf("the relay did not mirror the limit into %s: %+v v%d %v", k.Control, got, v, err)
		}
	}
	l := s.newLoad(loadTasks, loadTime)
	wait(ctx, l.start(ctx))
	s.check(ctx, l, checkOpts{settle: 2 * time.Minute})

	// Every window [claim i, claim j] of beta holds at most Burst + its length /
	// (Period/Limit) starts (one more for the claim times' millisecond rounding).
	rows, err := s.admin.Query(ctx, `SELECT claimed_at FROM fault_effects WHERE queue = 'beta' ORDER BY claimed_at`)
	if err != nil {
		t.Fatal(err)
	}
	var claims []time.Time
	for rows.Next() {
		var at time.Time
		if err := rows.Scan(&at); err != nil {
			t.Fatal(err)
		}
		claims = append(claims, at)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	emit := rate.Period / time.Duration(rate.Limit)
	worst := 0.0
	for i := range claims {
		for j := i + 1; j < len(claims); j++ {
			allowed := float64(rate.Burst) + float64(claims[j].Sub(claims[i]))/float64(emit) + 1
			if over := float64(j-i+1) - allowed; over > worst {
				worst = over
			}
		}
	}
	if worst > 0 {
		t.Errorf("beta's starts outran the limit %v by %.1f in some window", rate, worst)
	}
	if len(claims) < 100 {
		t.Fatalf("only %d starts of beta: the limit was never tested", len(claims))
	}
	span := claims[len(claims)-1].Sub(claims[0])
	observed := float64(len(claims)-1) / span.Seconds()
	if observed > float64(rate.Limit)*1.05 {
		t.Errorf("beta ran %.1f/s, limit %d/s", observed, rate.Limit)
	}
	// The others drained while beta was held back.
	var lastOther, lastBeta time.Time
	if err := s.admin.QueryRow(ctx, `SELECT max(claimed_at) FILTER (WHERE queue <> 'beta'), max(claimed_at) FILTER (WHERE queue = 'beta') FROM fault_effects`).Scan(&lastOther, &lastBeta); err != nil {
		t.Fatal(err)
	}
	if !lastOther.Before(lastBeta) {
		t.Errorf("the other queues finished at %v, beta at %v: beta was not the one held back", lastOther, lastBeta)
	}
	t.Logf("beta: %d starts over %v (%.1f/s, limit %v)", len(claims), span.Round(time.Millisecond), observed, rate)
}
