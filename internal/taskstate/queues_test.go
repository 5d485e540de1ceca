package taskstate

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/internal/validate"
)

func TestQueueControls(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	s := New(Config{Schema: "public"})
	if c, err := s.QueueControls(ctx, pool); err != nil || len(c) != 0 {
		t.Fatalf("no queue paused yet: %v, %v", c, err)
	}
	c1, err := s.SetPaused(ctx, pool, "b", true)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := s.SetPaused(ctx, pool, "b", false)
	if err != nil || c2.Version <= c1.Version || c2.Paused || !c1.Paused {
		t.Fatalf("controls %+v then %+v (%v): each change must bump the version", c1, c2, err)
	}
	if _, err := s.SetPaused(ctx, pool, "a", true); err != nil {
		t.Fatal(err)
	}
	c, err := s.QueueControls(ctx, pool)
	if err != nil || len(c) != 2 || c[0].Queue != "a" || !c[0].Paused || c[1].Queue != "b" || c[1].Paused || c[1].Version != c2.Version {
		t.Fatalf("controls %+v, %v", c, err)
	}
	if c[0].Rate != (validate.RateLimit{Period: time.Second, Burst: 1}) {
		t.Fatalf("default rate limit %+v, want none", c[0].Rate)
	}
	if _, err := s.SetPaused(ctx, pool, "bad queue", true); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("invalid queue: %v", err)
	}

	// The rate limit keeps the pause, and the pause keeps the limit.
	r, err := s.SetRateLimit(ctx, pool, "a", validate.RateLimit{Limit: 50, Period: time.Minute})
	want := validate.RateLimit{Limit: 50, Period: time.Minute, Burst: 1}
	if err != nil || r.Rate != want || !r.Paused || r.Version <= c[0].Version {
		t.Fatalf("set limit: %+v %v", r, err)
	}
	if p, err := s.SetPaused(ctx, pool, "a", false); err != nil || p.Rate != want || p.Version <= r.Version {
		t.Fatalf("resume: %+v %v", p, err)
	}
	if n, err := s.SetRateLimit(ctx, pool, "new", validate.RateLimit{Limit: 5, Burst: 3}); err != nil ||
		n.Rate != (validate.RateLimit{Limit: 5, Period: time.Second, Burst: 3}) || n.Paused {
		t.Fatalf("limit of a new queue: %+v %v", n, err)
	}
	for _, bad := range []validate.RateLimit{{Limit: -1}, {Limit: 1, Period: time.Nanosecond}, {Limit: 1, Burst: -2}} {
		if _, err := s.SetRateLimit(ctx, pool, "a", bad); !errors.Is(err, ErrInvalidArgument) || !errors.Is(err, validate.ErrInvalidRateLimit) {
			t.Errorf("limit %+v: %v", bad, err)
		}
	}
	if _, err := s.SetRateLimit(ctx, pool, "", validate.RateLimit{}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("empty queue: %v", err)
	}
	c, _ = s.QueueControls(ctx, pool)
	if c[0].Rate != want || c[0].Paused {
		t.Errorf("refused limits changed the row: %+v", c[0])
	}
}
