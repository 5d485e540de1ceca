package dispatch

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// keyOf maps a claimed task's id ("<key>-<n>", or "free-<n>" for a task without
// a key) to its key.
func keyOf(id string) string { return id[:strings.IndexByte(id, '-')] }

func keyedTasks(now time.Time, key string, n int, due time.Duration) []Task {
	out := make([]Task, n)
	for i := range out {
		out[i] = Task{ID: fmt.Sprintf("%s-%02d", key, i), RunAt: now.Add(due + time.Duration(i)*time.Millisecond), Key: key}
	}
	return out
}

func (b testBundle) setKeys(t *testing.T, version int64, cap, throttle int, window time.Duration) {
	t.Helper()
	if ok, err := b.c.SetControls(ctxT(t), b.queue, version, Controls{KeyConcurrency: cap, KeyThrottle: throttle, KeyWindow: window}); err != nil || !ok {
		t.Fatalf("SetControls: %v, %v", ok, err)
	}
}

func countKeys(cl Claim) map[string]int {
	out := map[string]int{}
	for _, ct := range cl.Tasks {
		out[keyOf(ct.ID)]++
	}
	return out
}

// A capped key's due tasks do not hold back the other keys' tasks behind them,
// and a completion gives the slot back and lets the key's next task in.
func TestKeyCapParksWithoutBlockingOtherKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.setKeys(t, 1, 2, 0, 0)
	// 20 tasks of "big" due first, then 3 of "small" and 3 without a key.
	b.enqueue(t, keyedTasks(now, "big", 20, -time.Minute)...)
	b.enqueue(t, keyedTasks(now, "small", 3, -time.Second)...)
	free := keyedTasks(now, "free", 3, -time.Second)
	for i := range free {
		free[i].Key = ""
	}
	b.enqueue(t, free...)

	cl := b.claim(t, 10, time.Minute)
	got := countKeys(cl)
	if got["big"] != 2 || got["small"] != 2 || got["free"] != 3 {
		t.Fatalf("claimed per key %v, want big 2, small 2, free 3", got)
	}
	if cl.NextDue != -1 {
		t.Errorf("NextDue %v: every task left is parked, ready is empty", cl.NextDue)
	}
	parked, err := b.rdb.ZCard(ctx, b.k.KeyPrefix+"p:big").Result()
	if err != nil || parked != 18 {
		t.Fatalf("parked big %d, %v; want 18", parked, err)
	}
	// Nothing more may start: both keys are at their cap.
	more := b.claim(t, 10, time.Minute)
	if g := countKeys(more); g["big"] != 0 || g["small"] != 0 {
		t.Fatalf("second claim per key %v, want nothing (small at its cap too)", g)
	}
	// A completion of big frees one slot: exactly one big task comes back.
	var done string
	for _, ct := range cl.Tasks {
		if keyOf(ct.ID) == "big" {
			if err := b.c.Complete(ctx, b.queue, ct.ID, ct.Token); err != nil {
				t.Fatal(err)
			}
			done = ct.ID
			break
		}
	}
	after := b.claim(t, 10, time.Minute)
	if g := countKeys(after); g["big"] != 1 {
		t.Fatalf("after completing %s: claimed per key %v, want big 1", done, g)
	}
	// The earliest parked task came back first.
	if after.Tasks[0].ID != "big-02" {
		t.Errorf("readmitted %s, want big-02", after.Tasks[0].ID)
	}
	if n, _ := b.rdb.HGet(ctx, b.k.KeyPrefix+"run", "big").Int(); n != 2 {
		t.Errorf("big runs counted %d, want 2", n)
	}
}

// A lost worker's slot frees when the reaper takes its lease back; retry, kill and
// release give theirs back too.
func TestKeySlotFreedByEveryLeaseEnd(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.setKeys(t, 1, 1, 0, 0)
	b.enqueue(t, keyedTasks(now, "acct", 6, -time.Minute)...)
	running := func() int {
		n, _ := b.rdb.HGet(ctx, b.k.KeyPrefix+"run", "acct").Int()
		return n
	}
	next := func(what string) ClaimedTask {
		t.Helper()
		cl := b.claim(t, 5, time.Minute)
		if len(cl.Tasks) != 1 {
			t.Fatalf("%s: claimed %d tasks, want 1 (cap 1)", what, len(cl.Tasks))
		}
		if running() != 1 {
			t.Fatalf("%s: %d runs counted, want 1", what, running())
		}
		return cl.Tasks[0]
	}
	ct := next("first")
	// The worker is lost: its lease runs out (as the lease tests do: an expired
	// deadline) and the reaper takes it back.
	b.rdb.ZAdd(ctx, b.k.Active, redisZ(ct.ID, 1))
	if _, err := b.c.Reap(ctx, b.queue, 100); err != nil {
		t.Fatal(err)
	}
	if running() != 0 {
		t.Fatalf("after the reap: %d runs counted, want 0", running())
	}
	ct = next("after reap")
	if _, err := b.c.Retry(ctx, b.queue, ct.ID, ct.Token, time.Hour, "boom"); err != nil {
		t.Fatal(err)
	}
	ct = next("after retry")
	if err := b.c.Kill(ctx, b.queue, ct.ID, ct.Token, "dead"); err != nil {
		t.Fatal(err)
	}
	ct = next("after kill")
	if err := b.c.ReleaseAfter(ctx, b.queue, ct.ID, ct.Token, time.Hour); err != nil {
		t.Fatal(err)
	}
	ct = next("after release")
	if _, err := b.c.Remove(ctx, b.queue, ct.ID); err != nil {
		t.Fatal(err)
	}
	next("after remove")
}

// The throttle lets at most N tasks of a key start in any window, and the claim
// reports when the window lets the next one in.
func TestKeyThrottle(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.setKeys(t, 1, 0, 3, 400*time.Millisecond)
	b.enqueue(t, keyedTasks(now, "api", 7, -time.Minute)...)
	b.enqueue(t, keyedTasks(now, "other", 1, -time.Second)...)
	cl := b.claim(t, 10, time.Minute)
	if g := countKeys(cl); g["api"] != 3 || g["other"] != 1 {
		t.Fatalf("claimed per key %v, want api 3, other 1", g)
	}
	for _, ct := range cl.Tasks { // completions give no start back
		if err := b.c.Complete(ctx, b.queue, ct.ID, ct.Token); err != nil {
			t.Fatal(err)
		}
	}
	again := b.claim(t, 10, time.Minute)
	if len(again.Tasks) != 0 {
		t.Fatalf("claimed %d within the window", len(again.Tasks))
	}
	if again.NextDue <= 0 || again.NextDue > 400*time.Millisecond {
		t.Fatalf("NextDue %v, want the window's opening within 400ms", again.NextDue)
	}
	// Wait for the window by the claim's own report (no fixed sleep), then
	// claim until the second window's three have started.
	got := 0
	deadline := time.Now().Add(10 * time.Second)
	for got < 3 && time.Now().Before(deadline) {
		time.Sleep(again.NextDue)
		again = b.claim(t, 10, time.Minute)
		got += len(again.Tasks)
	}
	if got != 3 {
		t.Fatalf("second window started %d, want 3", got)
	}
	log, err := b.rdb.ZRangeWithScores(ctx, b.k.KeyPrefix+"s:api", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Every start in the log: no window of 400 ms holds more than 3.
	for i := range log {
		in := 0
		for j := i; j < len(log) && log[j].Score-log[i].Score < 400; j++ {
			in++
		}
		if in > 3 {
			t.Fatalf("%d starts within 400ms from %v", in, log[i].Score)
		}
	}
}

// Lifting the cap puts every parked task back into ready.
func TestKeyLimitsLiftedReadmit(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.setKeys(t, 1, 1, 0, 0)
	b.enqueue(t, keyedTasks(now, "k", 5, -time.Minute)...)
	if cl := b.claim(t, 5, time.Minute); len(cl.Tasks) != 1 {
		t.Fatalf("claimed %d, want 1", len(cl.Tasks))
	}
	st, err := b.c.Stats(ctx, b.queue)
	if err != nil {
		t.Fatal(err)
	}
	b.setKeys(t, 2, 0, 0, 0)
	if n, _ := b.rdb.ZCard(ctx, b.k.Ready).Result(); n != 4 {
		t.Fatalf("ready %d after lifting the cap, want 4 (stats before: %+v)", n, st)
	}
	if n, _ := b.rdb.Exists(ctx, b.k.KeyPrefix+"p:k", b.k.KeyPrefix+"keys").Result(); n != 0 {
		t.Fatalf("%d parking keys left", n)
	}
	if cl := b.claim(t, 5, time.Minute); len(cl.Tasks) != 4 {
		t.Fatalf("claimed %d after lifting the cap, want 4", len(cl.Tasks))
	}
}

// A queue without limits per key, or tasks without keys, write no key state.
func TestKeysCostNothingWithoutLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.enqueue(t, keyedTasks(now, "k", 5, -time.Minute)...)
	cl := b.claim(t, 5, time.Minute)
	if len(cl.Tasks) != 5 {
		t.Fatalf("claimed %d, want 5: no limits, no cap", len(cl.Tasks))
	}
	for _, ct := range cl.Tasks {
		if err := b.c.Complete(ctx, b.queue, ct.ID, ct.Token); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := b.rdb.Keys(ctx, b.k.KeyPrefix+"*").Result()
	if err != nil || len(keys) != 0 {
		t.Fatalf("key state %v, %v; want none", keys, err)
	}
	if f, _ := b.rdb.HKeys(ctx, b.k.Control).Result(); len(f) != 0 {
		t.Errorf("controls hash fields %v", f)
	}
}
