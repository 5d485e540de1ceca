package dispatch

import (
	"maps"
	"testing"
	"time"
)

// KeyRuns reads the runs holding a slot per key, as the claim script counts
// them: a claim adds, a completion gives back, and a key with none is absent.
func TestKeyRuns(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	if got, err := b.c.KeyRuns(ctx, b.queue); err != nil || len(got) != 0 {
		t.Fatalf("KeyRuns of a queue without limits: %v, %v; want empty", got, err)
	}
	now := redisNow(t, b.rdb)
	b.setKeys(t, 1, 2, 0, 0)
	b.enqueue(t, keyedTasks(now, "big", 5, -time.Minute)...)
	b.enqueue(t, keyedTasks(now, "small", 1, -time.Second)...)
	cl := b.claim(t, 10, time.Minute)
	got, err := b.c.KeyRuns(ctx, b.queue)
	if want := map[string]int{"big": 2, "small": 1}; err != nil || !maps.Equal(got, want) {
		t.Fatalf("KeyRuns after the claim: %v, %v; want %v", got, err, want)
	}
	for _, ct := range cl.Tasks {
		if keyOf(ct.ID) == "small" {
			if err := b.c.Complete(ctx, b.queue, ct.ID, ct.Token); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err = b.c.KeyRuns(ctx, b.queue)
	if want := map[string]int{"big": 2}; err != nil || !maps.Equal(got, want) {
		t.Fatalf("KeyRuns after small completed: %v, %v; want %v", got, err, want)
	}
	if _, err := b.c.KeyRuns(ctx, "bad queue name{"); err == nil {
		t.Error("KeyRuns of an invalid queue name: no error")
	}
}
