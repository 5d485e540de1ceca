package bench

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/validate"
)

// rateLimitWorkers and rateLimitRate: 4 workers pulling as fast as they can from
// a queue limited to 200 starts a second.
const (
	rateLimitWorkers = 4
	rateLimitRate    = 200
)

// rateLimit: a backlog in a queue limited to 200 starts/s and another backlog in
// an unlimited queue, 4 workers of 32 slots each serving both; the limited
// queue's observed rate over 60 s (starts by the Redis clock of their claims),
// and the other queue's drain rate meanwhile (no starvation).
func rateLimit(ctx context.Context, s *session, r *Result) error {
	window := max(time.Duration(float64(time.Minute)*s.env.Scale), 2*time.Second)
	limited := int(window.Seconds()*rateLimitRate) + 2*rateLimitRate // more than the window can start
	other := s.n(20_000)
	rate := validate.RateLimit{Limit: rateLimitRate, Period: time.Second, Burst: s.env.RateBurst}.WithDefaults()
	r.Params["workers"], r.Params["slots_per_worker"], r.Params["limit"] = rateLimitWorkers, 32, rate.String()
	r.Params["window"], r.Params["limited_backlog"], r.Params["other_backlog"] = window.String(), limited, other

	if _, err := s.setRateLimit(ctx, "limited", rate); err != nil {
		return err
	}
	if err := s.fillBacklogs(ctx, queueBacklog{queue: "limited", n: limited}, queueBacklog{queue: "other", n: other}); err != nil {
		return err
	}

	var (
		mu        sync.Mutex
		claims    []time.Time // of the limited queue, Redis clock
		otherDone atomic.Int64
		otherLast atomic.Int64 // UnixNano of the other queue's last start
	)
	var stops []func() error
	for range rateLimitWorkers {
		w, err := clientkit.NewClient(s.pool, s.dq, s.ob, delayq.WorkerConfig{})
		if err != nil {
			return err
		}
		qc := delayq.QueueConfig{Concurrency: 32}
		if err := w.Handle("limited", func(_ context.Context, t *delayq.Task) error {
			mu.Lock()
			claims = append(claims, t.ClaimedAt)
			mu.Unlock()
			return nil
		}, qc); err != nil {
			return err
		}
		if err := w.Handle("other", func(context.Context, *delayq.Task) error {
			otherDone.Add(1)
			otherLast.Store(time.Now().UnixNano())
			return nil
		}, qc); err != nil {
			return err
		}
		stops = append(stops, s.background(ctx, w.Run))
	}
	start := time.Now()
	err := waitFor(ctx, window+time.Minute, "the window", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return len(claims) > 0 && claims[len(claims)-1].Sub(claims[0]) >= window, nil
	})
	err = stopAll(err, stops)
	if err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	first := claims[0]
	for _, c := range claims {
		first = minTime(first, c)
	}
	var in int
	for _, c := range claims {
		if c.Sub(first) < window {
			in++
		}
	}
	observed := float64(in) / window.Seconds()
	r.add("rate_limited_observed", observed, "starts/s")
	r.add("rate_limited_error", 100*math.Abs(observed-rateLimitRate)/rateLimitRate, "% off the limit")
	otherSpan := time.Unix(0, otherLast.Load()).Sub(start)
	r.add("other_queue_drain", float64(otherDone.Load())/otherSpan.Seconds(), "tasks/s")
	r.Checks = map[string]int64{"other_done": otherDone.Load()}
	if otherDone.Load() != int64(other) {
		return fmt.Errorf("the other queue ran %d of %d in the window: starved", otherDone.Load(), other)
	}
	return nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
