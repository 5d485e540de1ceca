package dispatch

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/validate"
)

// TestPausedQueueClaimsNothing: a paused queue's due tasks are not claimed, keep
// their due times, and are claimed after the resume; controls apply only over an
// older version; the resume wakes a waiter.
func TestPausedQueueClaimsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	due := now.Add(-time.Second)
	b.enqueue(t, Task{ID: "a", RunAt: due}, Task{ID: "b", RunAt: due})

	if ok, err := b.c.SetControls(ctx, "q", 2, Controls{Paused: true}); err != nil || !ok {
		t.Fatalf("pause: %v %v", ok, err)
	}
	cl := b.claim(t, 10, time.Minute)
	if len(cl.Tasks) != 0 || cl.NextDue != -1 {
		t.Fatalf("paused queue: claimed %d, next due %v; want none, -1 (sleep until woken)", len(cl.Tasks), cl.NextDue)
	}
	// An older version (a late mirror write) does not resume it.
	if ok, err := b.c.SetControls(ctx, "q", 1, Controls{}); err != nil || ok {
		t.Fatalf("older resume applied: %v %v", ok, err)
	}
	if c, v, _ := b.c.Controls(ctx, "q"); !c.Paused || v != 2 {
		t.Fatal("older version resumed the queue")
	}
	if len(b.claim(t, 10, time.Minute).Tasks) != 0 {
		t.Fatal("claimed from a paused queue")
	}

	w := b.c.NewWaiter()
	defer w.Close()
	m, err := w.Mark(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := b.c.SetControls(ctx, "q", 3, Controls{}); err != nil || !ok {
		t.Fatalf("resume: %v %v", ok, err)
	}
	start := time.Now()
	if err := w.Wait(ctx, m, time.Minute); err != nil || time.Since(start) > 10*time.Second {
		t.Fatalf("the resume did not wake the waiter: %v after %v", err, time.Since(start))
	}
	cl = b.claim(t, 10, time.Minute)
	if len(cl.Tasks) != 2 {
		t.Fatalf("claimed %d after the resume, want 2", len(cl.Tasks))
	}
	for _, ct := range cl.Tasks {
		if !ct.Due.Equal(due.Truncate(time.Millisecond)) && ct.Due.UnixMilli() != due.UnixMilli() {
			t.Errorf("task %s due %v, want its own due time %v", ct.ID, ct.Due, due)
		}
	}
}

// TestRateLimitedClaims: the claim script lets at most Burst starts happen at
// once and then one per Period/Limit, by the Redis clock; a refused claim says how
// long until the next start is allowed, and waiting that long is enough; a newer
// limit applies from the next claim, restarting the limiter, and wakes waiters;
// an older one changes nothing.
func TestRateLimitedClaims(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	due := redisNow(t, b.rdb).Add(-time.Second)
	var tasks []Task
	for i := range 20 {
		tasks = append(tasks, Task{ID: fmt.Sprintf("t%02d", i), RunAt: due})
	}
	b.enqueue(t, tasks...)

	rate := RateLimit{Limit: 10, Period: time.Second, Burst: 3} // a start every 100 ms
	if ok, err := b.c.SetControls(ctx, "q", 1, Controls{Rate: rate}); err != nil || !ok {
		t.Fatalf("set limit: %v %v", ok, err)
	}
	if got, v, err := b.c.Controls(ctx, "q"); err != nil || got.Rate != rate || got.Paused || v != 1 {
		t.Fatalf("controls in Redis %+v v%d %v, want %+v", got, v, err, rate)
	}
	cl := b.claim(t, 10, time.Minute)
	if len(cl.Tasks) != 3 || cl.NextDue != 0 || cl.RateWait <= 0 || cl.RateWait > 100*time.Millisecond {
		t.Fatalf("first claim: %d tasks, next due %v, rate wait %v; want the burst of 3, 0, (0, 100ms]",
			len(cl.Tasks), cl.NextDue, cl.RateWait)
	}
	cl = b.claim(t, 10, time.Minute)
	if len(cl.Tasks) != 0 && cl.RateWait == 0 {
		// Only a claim more than 100 ms later may take one more.
		t.Logf("second claim took %d (a slow machine)", len(cl.Tasks))
	}
	for range 3 {
		if cl.RateWait > 0 {
			time.Sleep(cl.RateWait) // the test's own clock, not the product's
		}
		cl = b.claim(t, 10, time.Minute)
		if len(cl.Tasks) < 1 || len(cl.Tasks) > 3 {
			t.Fatalf("after the rate wait: claimed %d, want 1..3", len(cl.Tasks))
		}
	}

	// An older version does not lift the limit.
	if ok, err := b.c.SetControls(ctx, "q", 1, Controls{}); err != nil || ok {
		t.Fatalf("older controls applied: %v %v", ok, err)
	}
	w := b.c.NewWaiter()
	defer w.Close()
	m, err := w.Mark(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	slow := RateLimit{Limit: 1, Period: time.Hour, Burst: 2}
	if ok, err := b.c.SetControls(ctx, "q", 2, Controls{Rate: slow}); err != nil || !ok {
		t.Fatalf("new limit: %v %v", ok, err)
	}
	if err := w.Wait(ctx, m, time.Minute); err != nil {
		t.Fatalf("a changed limit did not wake the waiter: %v", err)
	}
	// The limiter restarted: the new burst, then an hour's wait.
	cl = b.claim(t, 10, time.Minute)
	if len(cl.Tasks) != 2 || cl.RateWait < 59*time.Minute || cl.RateWait > time.Hour {
		t.Fatalf("under the new limit: %d tasks, rate wait %v; want 2, about 1h", len(cl.Tasks), cl.RateWait)
	}
	if cl = b.claim(t, 10, time.Minute); len(cl.Tasks) != 0 || cl.NextDue != 0 || cl.RateWait < 59*time.Minute {
		t.Fatalf("refused claim: %d tasks, next due %v, rate wait %v", len(cl.Tasks), cl.NextDue, cl.RateWait)
	}
	// No limit: the rest at once.
	if ok, err := b.c.SetControls(ctx, "q", 3, Controls{}); err != nil || !ok {
		t.Fatalf("lift: %v %v", ok, err)
	}
	if cl = b.claim(t, 100, time.Minute); cl.RateWait != 0 || len(cl.Tasks) == 0 || cl.NextDue != -1 {
		t.Fatalf("without a limit: %d tasks, rate wait %v, next due %v", len(cl.Tasks), cl.RateWait, cl.NextDue)
	}
	// A bad limit is refused and writes nothing.
	for _, bad := range []RateLimit{{Limit: -1}, {Limit: 1, Period: time.Microsecond}, {Limit: 1, Burst: -1}, {Limit: 1, Period: 1500 * time.Microsecond}} {
		if _, err := b.c.SetControls(ctx, "q", 9, Controls{Rate: bad}); !errors.Is(err, ErrInvalidArgument) || !errors.Is(err, validate.ErrInvalidRateLimit) {
			t.Errorf("limit %+v: %v, want ErrInvalidArgument", bad, err)
		}
	}
	if _, v, _ := b.c.Controls(ctx, "q"); v != 3 {
		t.Errorf("a refused limit wrote version %d", v)
	}
}

// TestClaimStartDeadline: a task claimed after its start deadline comes back
// marked Missed and takes nothing of the rate limit; the deadline is in the task
// hash only when set.
func TestClaimStartDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	due := now.Add(-time.Second)
	b.enqueue(t, Task{ID: "a", RunAt: due, StartBy: now.Add(-time.Millisecond)},
		Task{ID: "b", RunAt: due, StartBy: now.Add(time.Hour)}, Task{ID: "c", RunAt: due})
	k, _ := b.c.Keys("q")
	if ok, _ := b.rdb.HExists(ctx, k.TaskKey("c"), "d").Result(); ok {
		t.Fatal("a task without a deadline has one in its hash")
	}
	if ok, err := b.c.SetControls(ctx, "q", 1, Controls{Rate: RateLimit{Limit: 1, Period: time.Hour, Burst: 1}}); err != nil || !ok {
		t.Fatalf("limit: %v %v", ok, err)
	}
	cl := b.claim(t, 10, time.Minute)
	if len(cl.Tasks) != 1 || cl.Tasks[0].ID != "a" || !cl.Tasks[0].Missed || cl.RateWait != 0 {
		t.Fatalf("first claim %+v: want a, missed, and the limit untouched", cl)
	}
	cl = b.claim(t, 10, time.Minute)
	if len(cl.Tasks) != 1 || cl.Tasks[0].ID != "b" || cl.Tasks[0].Missed || !cl.Tasks[0].StartBy.Equal(now.Add(time.Hour)) {
		t.Fatalf("second claim %+v: want b, on time", cl)
	}
	if cl = b.claim(t, 10, time.Minute); len(cl.Tasks) != 0 || cl.RateWait < 59*time.Minute {
		t.Fatalf("third claim %+v: want c refused by the limit", cl)
	}
}
