package delayq

import (
	"testing"
	"time"
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

	if ok, err := b.c.SetPaused(ctx, "q", 2, true); err != nil || !ok {
		t.Fatalf("pause: %v %v", ok, err)
	}
	cl := b.claim(t, 10, time.Minute)
	if len(cl.Tasks) != 0 || cl.NextDue != -1 {
		t.Fatalf("paused queue: claimed %d, next due %v; want none, -1 (sleep until woken)", len(cl.Tasks), cl.NextDue)
	}
	// An older version (a late mirror write) does not resume it.
	if ok, err := b.c.SetPaused(ctx, "q", 1, false); err != nil || ok {
		t.Fatalf("older resume applied: %v %v", ok, err)
	}
	if p, _ := b.c.Paused(ctx, "q"); !p {
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
	if ok, err := b.c.SetPaused(ctx, "q", 3, false); err != nil || !ok {
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
