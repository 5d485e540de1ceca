package dispatch

import (
	"fmt"
	"testing"
	"time"
)

// fairBacklog enqueues, in a queue with key limits (so fair dispatch), 300 tasks
// of "big" due a minute ago and 5 tasks of each of 10 small keys due a second
// ago: in due order every big task comes before any small one.
func fairBacklog(t *testing.T, b testBundle, cap int) {
	t.Helper()
	now := redisNow(t, b.rdb)
	b.setKeys(t, 1, cap, 0, 0)
	b.enqueue(t, keyedTasks(now, "big", 300, -time.Minute)...)
	for k := range 10 {
		b.enqueue(t, keyedTasks(now, fmt.Sprintf("s%d", k), 5, -time.Second)...)
	}
}

// A key with a backlog does not delay the keys with a few tasks: claims take the
// keys in turn, so the 50 small tasks start within the first 5 rounds of 11 starts
// (one a key a round) although 300 big tasks were due before them. The big key
// keeps one task in ready, the rest wait in its ZSET, and the stats still count them.
func TestFairSkewedBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	fairBacklog(t, b, 1000) // a cap that never binds: fairness alone
	if st, err := b.c.Stats(ctx, b.queue); err != nil || st.Ready != 350 {
		t.Fatalf("Stats: ready %d, %v; want 350 (parked tasks count)", st.Ready, err)
	}
	if n, err := b.rdb.ZCard(ctx, b.k.Ready).Result(); err != nil || n != 11 {
		t.Fatalf("ready holds %d, %v; want 11 (one head a key)", n, err)
	}
	got := map[string]int{}
	for round := range 5 {
		cl := b.claim(t, 11, time.Minute)
		c := countKeys(cl)
		if len(c) != 11 {
			t.Fatalf("round %d: claimed per key %v, want one of each of 11 keys", round, c)
		}
		for k, n := range c {
			got[k] += n
		}
		for _, ct := range cl.Tasks {
			if ct.Due.After(cl.Now) {
				t.Fatalf("%s started at %v before its due time %v", ct.ID, cl.Now, ct.Due)
			}
		}
	}
	for k := range 10 {
		if n := got[fmt.Sprintf("s%d", k)]; n != 5 {
			t.Errorf("small key s%d started %d of its 5 tasks in 5 rounds", k, n)
		}
	}
	if got["big"] != 5 {
		t.Errorf("big started %d in 5 rounds, want 5 (one a round)", got["big"])
	}
	// The big key alone is left: it runs at full speed.
	if cl := b.claim(t, 50, time.Minute); len(cl.Tasks) != 50 {
		t.Fatalf("big alone: claimed %d of 50", len(cl.Tasks))
	}
	// The claim reports each task's own due time: big's were a minute ago.
	cl := b.claim(t, 1, time.Minute)
	if len(cl.Tasks) != 1 || cl.Now.Sub(cl.Tasks[0].Due) < 50*time.Second {
		t.Fatalf("claimed %+v at %v: want a big task due about a minute ago", cl.Tasks, cl.Now)
	}
	if st, err := b.c.Stats(ctx, b.queue); err != nil || st.Ready != 350-106 {
		t.Fatalf("Stats: ready %d, %v; want %d", st.Ready, err, 350-106)
	}
}

// With a cap, fairness shares what the caps leave: no key runs more than its cap,
// and the small keys are not held back by the big key's backlog.
func TestFairCapsHold(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	fairBacklog(t, b, 4)
	cl := b.claim(t, 100, time.Minute)
	c := countKeys(cl)
	if c["big"] != 4 {
		t.Errorf("big started %d, want its cap 4", c["big"])
	}
	for k := range 10 {
		if n := c[fmt.Sprintf("s%d", k)]; n != 4 {
			t.Errorf("s%d started %d, want its cap 4", k, n)
		}
	}
	// Complete every run of big: exactly 4 more come, never a fifth at once.
	for _, ct := range cl.Tasks {
		if keyOf(ct.ID) == "big" {
			if err := b.c.Complete(ctx, b.queue, ct.ID, ct.Token); err != nil {
				t.Fatal(err)
			}
		}
	}
	more := countKeys(b.claim(t, 100, time.Minute))
	if more["big"] != 4 || len(more) != 1 {
		t.Errorf("after big's runs completed: claimed %v, want big 4 only", more)
	}
	if n, _ := b.rdb.HGet(ctx, b.k.KeyPrefix+"run", "big").Int(); n != 4 {
		t.Errorf("big runs counted %d, want 4", n)
	}
	if st, err := b.c.Stats(ctx, b.queue); err != nil || st.Ready != 350-48 || st.Active != 44 {
		t.Errorf("Stats %+v, %v; want ready %d, active 44 (4 of the 48 started completed)", st, err, 350-48)
	}
}

// Fairness never starts a task early: a key's next task promoted at its turn is
// claimed no sooner than its due time, and a task enqueued due before its key's
// head takes the head's place rather than wait behind it.
func TestFairNoEarlyStart(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.setKeys(t, 1, 1000, 0, 0)
	b.enqueue(t,
		Task{ID: "a-0", RunAt: now.Add(-time.Second), Key: "a"},
		Task{ID: "a-1", RunAt: now.Add(time.Hour), Key: "a"},
		Task{ID: "b-0", RunAt: now.Add(time.Hour), Key: "b"},
	)
	// b's head is due in an hour; a task due now must not wait behind it.
	b.enqueue(t, Task{ID: "b-1", RunAt: now.Add(-time.Second), Key: "b"})
	cl := b.claim(t, 10, time.Minute)
	if c := countKeys(cl); c["a"] != 1 || c["b"] != 1 || len(cl.Tasks) != 2 {
		t.Fatalf("claimed %v, want a-0 and b-1", c)
	}
	for _, ct := range cl.Tasks {
		if ct.ID != "a-0" && ct.ID != "b-1" {
			t.Errorf("claimed %s before its due time", ct.ID)
		}
	}
	if cl.NextDue < 59*time.Minute {
		t.Errorf("NextDue %v, want about an hour (the promoted task keeps its due time)", cl.NextDue)
	}
	if again := b.claim(t, 10, time.Minute); len(again.Tasks) != 0 {
		t.Errorf("claimed %d tasks due in an hour", len(again.Tasks))
	}
	// Removing a key's head hands its place to the key's next task.
	if ok, err := b.c.Remove(ctx, b.queue, "a-1"); err != nil || !ok {
		t.Fatalf("Remove: %v, %v", ok, err)
	}
	b.enqueue(t, Task{ID: "a-2", RunAt: now.Add(-time.Second), Key: "a"})
	if cl := b.claim(t, 10, time.Minute); len(cl.Tasks) != 1 || cl.Tasks[0].ID != "a-2" {
		t.Errorf("after removing a's head: claimed %+v, want a-2", cl.Tasks)
	}
}

// After Redis loses the queue, repair's restore puts each key's tasks back in
// its ZSET behind one head, and the claims take the keys in turn again.
func TestFairRestoreAfterLoss(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.setKeys(t, 1, 1000, 0, 0)
	var tasks []Task
	tasks = append(tasks, keyedTasks(now, "big", 40, -time.Minute)...)
	tasks = append(tasks, keyedTasks(now, "small", 3, -time.Second)...)
	b.enqueue(t, tasks...)
	// The loss: every key of the queue is gone.
	keys, err := b.rdb.Keys(ctx, b.k.Ready[:len(b.k.Ready)-len("ready")]+"*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys %v, %v", keys, err)
	}
	if err := b.rdb.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
	b.setKeys(t, 2, 1000, 0, 0) // the relay's control sync
	_, ps, err := b.c.Probe(ctx, b.queue, "big-00")
	if err != nil {
		t.Fatal(err)
	}
	var rs []Repair
	for _, tk := range tasks {
		rs = append(rs, Repair{Op: RepairRestore, ID: tk.ID, Fingerprint: ps[0].Fingerprint, Task: tk})
	}
	applied, err := b.c.RepairIf(ctx, b.queue, rs...)
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range applied {
		if !ok {
			t.Fatalf("restore of %s not applied", tasks[i].ID)
		}
	}
	if st, err := b.c.Stats(ctx, b.queue); err != nil || st.Ready != 43 {
		t.Fatalf("Stats after restore: ready %d, %v; want 43", st.Ready, err)
	}
	got := map[string]int{}
	for range 3 {
		for k, n := range countKeys(b.claim(t, 2, time.Minute)) {
			got[k] += n
		}
	}
	if got["small"] != 3 || got["big"] != 3 {
		t.Errorf("3 rounds after the restore: started %v, want small 3 and big 3", got)
	}
	// Every task is still there, once: 37 left.
	total := 0
	for {
		cl := b.claim(t, 100, time.Minute)
		if len(cl.Tasks) == 0 {
			break
		}
		total += len(cl.Tasks)
	}
	if total != 37 {
		t.Errorf("claimed %d more, want 37", total)
	}
}
