package dispatch

import (
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"
)

// claimedOrder lists the ids of ts in the order the claim returned them.
func claimedOrder(ts []ClaimedTask) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.ID
	}
	return out
}

// Among the due tasks, higher priorities are claimed first, by due time within one
// priority; priority 0 (no index entry) comes last, in due order. A claim of one
// task at a time gives the same order as one claim of all.
func TestPriorityOrderAmongDue(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 3, 100} {
		t.Run(strconv.Itoa(batch), func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{})
			now := redisNow(t, b.rdb)
			at := func(s int) time.Time { return now.Add(time.Duration(s-100) * time.Second) }
			b.enqueue(t,
				Task{ID: "p0-old", RunAt: at(1)},
				Task{ID: "p0-new", RunAt: at(9)},
				Task{ID: "p5-new", RunAt: at(8), Priority: 5},
				Task{ID: "p9-new", RunAt: at(7), Priority: 9},
				Task{ID: "p1-old", RunAt: at(2), Priority: 1},
				Task{ID: "p5-old", RunAt: at(3), Priority: 5},
				Task{ID: "p9-old", RunAt: at(4), Priority: 9},
			)
			var got []string
			for len(got) < 7 {
				cl := b.claim(t, batch, time.Minute)
				if len(cl.Tasks) == 0 {
					t.Fatalf("claimed nothing after %v", got)
				}
				got = append(got, claimedOrder(cl.Tasks)...)
			}
			want := []string{"p9-old", "p9-new", "p5-old", "p5-new", "p1-old", "p0-old", "p0-new"}
			if !slices.Equal(got, want) {
				t.Errorf("claim order %v, want %v", got, want)
			}
			if n := b.rdb.Exists(ctxT(t), b.k.Priority).Val(); n != 0 {
				t.Errorf("the priority index outlives its tasks")
			}
			// The next claim finds the index empty and clears its flag: the queue
			// then pays nothing for priorities again.
			if y := b.rdb.HExists(ctxT(t), b.k.Control, "y").Val(); !y && batch == 100 {
				t.Errorf("the flag was cleared while the index still had tasks")
			}
			b.claim(t, 1, time.Minute)
			if b.rdb.HExists(ctxT(t), b.k.Control, "y").Val() {
				t.Errorf("the index's flag outlives it")
			}
		})
	}
}

// A priority never makes a task start before it is due: a high-priority task due
// later waits, while the low-priority task due now is claimed; NextDue says when
// the high one falls due.
func TestPriorityNotYetDueWaits(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	now := redisNow(t, b.rdb)
	b.enqueue(t,
		Task{ID: "urgent-later", RunAt: now.Add(time.Hour), Priority: 9},
		Task{ID: "plain-now", RunAt: now.Add(-time.Second)},
		Task{ID: "some-later", RunAt: now.Add(2 * time.Hour), Priority: 3},
	)
	cl := b.claim(t, 10, time.Minute)
	if got := claimedOrder(cl.Tasks); !slices.Equal(got, []string{"plain-now"}) {
		t.Fatalf("claimed %v, want only plain-now", got)
	}
	if cl.NextDue < 59*time.Minute || cl.NextDue > time.Hour {
		t.Errorf("NextDue %v, want about an hour", cl.NextDue)
	}
	// The index still holds both, so they run in their turn.
	if n := b.rdb.ZCard(ctxT(t), b.k.Priority).Val(); n != 2 {
		t.Errorf("index holds %d, want 2", n)
	}
}

// An index entry out of step with ready (ahead of the task's ready score) never
// lets the task start early: the claim follows ready's due time.
func TestPriorityIndexAheadOfReadyIsNotEarly(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.enqueue(t, Task{ID: "x", RunAt: now.Add(time.Hour), Priority: 4})
	// Move the index entry to "due long ago" behind the script's back.
	if err := b.rdb.ZAdd(ctx, b.k.Priority, redisZ("x", 5e13+1000)).Err(); err != nil {
		t.Fatal(err)
	}
	if cl := b.claim(t, 10, time.Minute); len(cl.Tasks) != 0 {
		t.Fatalf("claimed %v an hour early", claimedOrder(cl.Tasks))
	}
	s, err := b.rdb.ZScore(ctx, b.k.Priority, "x").Result()
	if err != nil || s < 5e13+float64(now.Add(time.Hour).UnixMilli()) {
		t.Errorf("index entry %v %v, want moved to its ready due time", s, err)
	}
	// An entry whose task left ready is dropped.
	if err := b.rdb.ZAdd(ctx, b.k.Priority, redisZ("gone", 5e13)).Err(); err != nil {
		t.Fatal(err)
	}
	b.claim(t, 10, time.Minute)
	if err := b.rdb.ZScore(ctx, b.k.Priority, "gone").Err(); err == nil {
		t.Errorf("a stale index entry stayed")
	}
}

// The priority travels with the task: a release, a retry and a reaped lease put it
// back in the index; remove takes it out; a replacing enqueue sets or drops it.
func TestPriorityKeptByReleaseRetryReap(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{ReapBackoffBase: time.Millisecond, ReapBackoffMax: time.Millisecond})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.enqueue(t, Task{ID: "hi", RunAt: now.Add(-time.Minute), Priority: 7}, Task{ID: "lo", RunAt: now.Add(-2 * time.Minute)})
	inIndex := func(id string) bool { return b.rdb.ZScore(ctx, b.k.Priority, id).Err() == nil }
	claimHi := func() ClaimedTask {
		t.Helper()
		cl := b.claim(t, 1, time.Hour)
		if len(cl.Tasks) != 1 || cl.Tasks[0].ID != "hi" {
			t.Fatalf("claimed %v, want hi first", claimedOrder(cl.Tasks))
		}
		if inIndex("hi") {
			t.Fatal("a claimed task stayed in the index")
		}
		return cl.Tasks[0]
	}
	c := claimHi()
	if err := b.c.Release(ctx, "q", "hi", c.Token); err != nil || !inIndex("hi") {
		t.Fatalf("release: %v, in index %v", err, inIndex("hi"))
	}
	c = claimHi()
	if dead, err := b.c.Retry(ctx, "q", "hi", c.Token, time.Millisecond, "boom"); err != nil || dead || !inIndex("hi") {
		t.Fatalf("retry: dead %v, %v, in index %v", dead, err, inIndex("hi"))
	}
	waitDue(t, b, "hi")
	claimHi()
	if err := b.rdb.ZAdd(ctx, b.k.Active, redisZ("hi", 1)).Err(); err != nil { // the lease ran out
		t.Fatal(err)
	}
	if r, err := b.c.Reap(ctx, "q", 10); err != nil || !slices.Equal(r.Requeued, []string{"hi"}) || !inIndex("hi") {
		t.Fatalf("reap %+v %v, in index %v", r, err, inIndex("hi"))
	}
	if ti := b.info(t, "hi"); ti.Priority != 7 {
		t.Errorf("inspect: priority %d, want 7", ti.Priority)
	}
	// A higher version without a priority drops it; one with another sets it.
	if st := b.enqueue(t, Task{ID: "hi", Version: 2, RunAt: now.Add(-time.Minute)}); st[0] != Replaced || inIndex("hi") || b.info(t, "hi").Priority != 0 {
		t.Errorf("replaced without priority: %v, in index %v", st, inIndex("hi"))
	}
	if st := b.enqueue(t, Task{ID: "lo", Version: 2, RunAt: now.Add(-time.Minute), Priority: 2}); st[0] != Replaced || !inIndex("lo") {
		t.Errorf("replaced with priority: %v, in index %v", st, inIndex("lo"))
	}
	if _, err := b.c.Remove(ctx, "q", "lo"); err != nil || inIndex("lo") {
		t.Errorf("remove: %v, in index %v", err, inIndex("lo"))
	}
	if n := b.rdb.Exists(ctx, b.k.Priority).Val(); n != 0 {
		t.Errorf("the priority index outlives its tasks")
	}
}

// waitDue waits until task id of b's queue is due by the Redis clock (a retry's
// backoff of a millisecond).
func waitDue(t *testing.T, b testBundle, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ti := b.info(t, id)
		if !ti.Score.After(redisNow(t, b.rdb)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not due: %+v", id, ti)
		}
		time.Sleep(time.Millisecond)
	}
}

// A duplicate enqueue repairs a lost index entry as it repairs a lost ready member,
// and a restore writes the priority back.
func TestPriorityRepairedAndRestored(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.enqueue(t, Task{ID: "x", RunAt: now.Add(-time.Minute), Priority: 3})
	b.rdb.Del(ctx, b.k.Priority)
	b.enqueue(t, Task{ID: "x", RunAt: now.Add(-time.Minute), Priority: 3})
	if s, err := b.rdb.ZScore(ctx, b.k.Priority, "x").Result(); err != nil || s != 6e13+float64(now.Add(-time.Minute).UnixMilli()) {
		t.Errorf("index after a duplicate enqueue: %v %v", s, err)
	}
	_, pr, err := b.c.Probe(ctx, "q", "x")
	if err != nil {
		t.Fatal(err)
	}
	ok, err := b.c.RepairIf(ctx, "q", Repair{Op: RepairRestore, ID: "x", Fingerprint: pr[0].Fingerprint,
		Task: Task{RunAt: now.Add(-time.Second), Priority: 8, Payload: []byte("p")}})
	if err != nil || !ok[0] {
		t.Fatalf("restore %v %v", ok, err)
	}
	if ti := b.info(t, "x"); ti.Priority != 8 {
		t.Errorf("restored priority %d, want 8", ti.Priority)
	}
	if s, err := b.rdb.ZScore(ctx, b.k.Priority, "x").Result(); err != nil || s != 1e13+float64(now.Add(-time.Second).UnixMilli()) {
		t.Errorf("index after a restore: %v %v", s, err)
	}
	if _, err := b.c.Enqueue(ctx, "q", Task{ID: "bad", Priority: 10}); !errors.Is(err, ErrInvalidTask) {
		t.Errorf("priority 10: %v", err)
	}
}

// A task of priority 0 has no field for it and no index entry: its hash is the
// one-field hash of a plain task.
func TestPriorityZeroWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	b.enqueue(t, Task{ID: "plain", Payload: []byte("p")})
	if f := b.rdb.HKeys(ctx, b.k.TaskKey("plain")).Val(); !slices.Equal(f, []string{"p"}) {
		t.Errorf("hash fields %v, want [p]", f)
	}
	b.claim(t, 1, time.Minute)
	if n := b.rdb.Exists(ctx, b.k.Priority, b.k.Control).Val(); n != 0 {
		t.Errorf("a priority index or its flag without a priority")
	}
}
