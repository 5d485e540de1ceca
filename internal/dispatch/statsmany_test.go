package dispatch

import (
	"errors"
	"testing"
	"time"
)

// StatsMany reads what Stats and Overdue read, for many queues at once, in order;
// an invalid queue name changes nothing and is refused.
func TestStatsMany(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now, err := b.rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.Enqueue(ctx, "a", Task{ID: "due", RunAt: now.Add(-time.Second)}, Task{ID: "overdue", RunAt: now.Add(-2 * time.Minute)},
		Task{ID: "later", RunAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.Enqueue(ctx, "b", Task{ID: "x", RunAt: now.Add(-3 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.Claim(ctx, "b", 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	got, err := b.c.StatsMany(ctx, time.Minute, "a", "b", "empty")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d stats", len(got))
	}
	for i, q := range []string{"a", "b", "empty"} {
		s, err := b.c.Stats(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		o, err := b.c.Overdue(ctx, q, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		g := got[i]
		if g.Queue != q || g.Ready != s.Ready || g.DueNow != s.DueNow || g.Active != s.Active || g.Dead != s.Dead || g.Overdue != o {
			t.Errorf("%s: StatsMany %+v, Stats %+v overdue %d", q, g, s, o)
		}
	}
	if got[0].Ready != 3 || got[0].Overdue != 1 || got[1].Active != 1 || got[1].Overdue != 0 || got[2].Ready != 0 {
		t.Errorf("stats %+v", got)
	}
	if _, err := b.c.StatsMany(ctx, time.Minute, "a", "bad{q}"); err == nil {
		t.Errorf("invalid queue: %v", err)
	}
	if _, err := b.c.StatsMany(ctx, -time.Second, "a"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("negative overdueAfter: %v", err)
	}
}
