package dispatch

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// shardedQueue gives b's queue n shards (controls version v).
func shardedQueue(t *testing.T, b testBundle, v int64, n int) []Keys {
	t.Helper()
	if _, err := b.c.SetControls(ctxT(t), b.queue, v, Controls{Shards: n}); err != nil {
		t.Fatal(err)
	}
	l, err := b.c.layout(b.queue, n)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestShardedQueue: a queue of 3 shards, end to end through the Client: each task
// is in the shard its id names and nowhere else, a claim takes from every shard
// (max shared out), every lease call finds its shard from the token, and the
// counts, inspections, probes and scans cover every shard.
func TestShardedQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	l := shardedQueue(t, b, 1, 3)
	if n, err := b.c.Shards(ctx, b.queue); err != nil || n != 3 {
		t.Fatalf("Shards = %d, %v; want 3", n, err)
	}
	const total = 300
	tasks := make([]Task, total)
	ids := make([]string, total)
	for i := range tasks {
		ids[i] = fmt.Sprintf("order-%04d", i)
		tasks[i] = Task{ID: ids[i], Payload: []byte("p")}
	}
	st, err := b.c.Enqueue(ctx, b.queue, tasks...)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range st {
		if s != Added {
			t.Fatalf("task %d: %v", i, s)
		}
	}
	per := make([]int64, 3)
	for _, id := range ids {
		per[ShardOf(id, 3)]++
	}
	for k, key := range l {
		n, err := b.rdb.ZCard(ctx, key.Ready).Result()
		if err != nil || n != per[k] {
			t.Errorf("shard %d holds %d ready, want %d (%v)", k, n, per[k], err)
		}
	}
	for _, id := range ids[:20] {
		for k, key := range l {
			_, err := b.rdb.ZScore(ctx, key.Ready, id).Result()
			if (err == nil) != (k == ShardOf(id, 3)) {
				t.Fatalf("%s in shard %d: %v", id, k, err)
			}
		}
	}
	if again, err := b.c.Enqueue(ctx, b.queue, tasks[:10]...); err != nil || slices.ContainsFunc(again, func(s EnqueueStatus) bool { return s != Duplicate }) {
		t.Fatalf("enqueue again: %v, %v; want duplicates", again, err)
	}
	s, err := b.c.Stats(ctx, b.queue)
	if err != nil || s.Ready != total || s.DueNow != total {
		t.Fatalf("Stats = %+v, %v; want %d ready and due", s, err, total)
	}
	info, err := b.c.Inspect(ctx, b.queue, ids[5], "none", ids[0], ids[7])
	if err != nil {
		t.Fatal(err)
	}
	if info[0].ID != ids[5] || info[0].State != StateReady || info[1].State != StateMissing || info[2].ID != ids[0] || info[3].State != StateReady {
		t.Fatalf("Inspect = %+v", info)
	}
	_, probes, err := b.c.Probe(ctx, b.queue, ids[9], ids[1], "none")
	if err != nil || probes[0].ID != ids[9] || !probes[0].InReady || probes[2].State != StateMissing {
		t.Fatalf("Probe = %+v, %v", probes, err)
	}

	// A claim of 3 takes one task from each shard; each shard's token names it.
	cl, err := b.c.Claim(ctx, b.queue, 3, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(cl.Tasks) != 3 || cl.NextDue != 0 {
		t.Fatalf("claim of 3: %d tasks, next %v", len(cl.Tasks), cl.NextDue)
	}
	shards := map[int]bool{}
	for _, task := range cl.Tasks {
		shards[ShardOf(task.ID, 3)] = true
		if !strings.HasPrefix(task.Token, fmt.Sprintf("%d/3:", ShardOf(task.ID, 3))) {
			t.Errorf("token %q of %s does not name shard %d", task.Token, task.ID, ShardOf(task.ID, 3))
		}
	}
	if len(shards) != 3 {
		t.Fatalf("claim of 3 took from shards %v, want all three", shards)
	}
	// The lease calls, each routed by its token: retry, kill, release, extend.
	t0, t1, t2 := cl.Tasks[0], cl.Tasks[1], cl.Tasks[2]
	if dead, err := b.c.Retry(ctx, b.queue, t0.ID, t0.Token, time.Hour, "boom"); err != nil || dead {
		t.Fatalf("Retry = %v, %v", dead, err)
	}
	if err := b.c.Kill(ctx, b.queue, t1.ID, t1.Token, "bad"); err != nil {
		t.Fatal(err)
	}
	if err := b.c.Extend(ctx, b.queue, t2.ID, t2.Token, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := b.c.Release(ctx, b.queue, t2.ID, t2.Token); err != nil {
		t.Fatal(err)
	}
	if err := b.c.Complete(ctx, b.queue, t2.ID, t2.Token); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Complete after release: %v, want ErrLeaseLost", err)
	}
	if err := b.c.Complete(ctx, b.queue, t2.ID, "9/3:x.1"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("token naming no shard: %v, want ErrInvalidArgument", err)
	}

	// Drain the rest in claims of 50, completed together across shards.
	seen := map[string]bool{t0.ID: true, t1.ID: true}
	for {
		cl, err := b.c.Claim(ctx, b.queue, 50, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(cl.Tasks) == 0 {
			if cl.NextDue <= 0 {
				t.Fatalf("empty claim with NextDue %v, want the retried task's hour", cl.NextDue)
			}
			break
		}
		leases := make([]Lease, len(cl.Tasks))
		for i, task := range cl.Tasks {
			if cl.Now.Before(task.Due) {
				t.Fatalf("%s due %v, after the claim's Now %v", task.ID, task.Due, cl.Now)
			}
			if seen[task.ID] {
				t.Fatalf("%s claimed twice", task.ID)
			}
			seen[task.ID] = true
			leases[i] = Lease{ID: task.ID, Token: task.Token}
		}
		done, err := b.c.CompleteMany(ctx, b.queue, leases)
		if err != nil || slices.Contains(done, false) {
			t.Fatalf("CompleteMany = %v, %v", done, err)
		}
	}
	if len(seen) != total {
		t.Fatalf("%d tasks claimed, want %d", len(seen), total)
	}
	s, err = b.c.Stats(ctx, b.queue)
	if err != nil || s.Ready != 1 || s.Dead != 1 || s.Active != 0 {
		t.Fatalf("Stats after the drain = %+v, %v; want 1 ready (retried), 1 dead", s, err)
	}
	var scanned []string
	for cur := DeepScanCursor(); !cur.Done(); {
		var got []string
		if got, cur, err = b.c.ScanIDs(ctx, b.queue, cur, 10); err != nil {
			t.Fatal(err)
		}
		scanned = append(scanned, got...)
	}
	if !slices.Contains(scanned, t0.ID) || !slices.Contains(scanned, t1.ID) {
		t.Fatalf("the scan of every shard found %v, want %s and %s", scanned, t0.ID, t1.ID)
	}
	if qs, err := b.c.Queues(ctx); err != nil || !slices.Equal(qs, []string{b.queue}) {
		t.Fatalf("Queues = %v, %v; want only %q", qs, err, b.queue)
	}
}

// TestShardCountChanged: a Client that still routes by an old shard count is
// refused by Redis, reads the count again and puts every task in its shard.
func TestShardCountChanged(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	stale, err := New(b.rdb, Config{Prefix: b.prefix, ShardRefresh: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := stale.Shards(ctx, b.queue); err != nil || n != 1 {
		t.Fatalf("Shards = %d, %v", n, err)
	}
	l := shardedQueue(t, b, 1, 4)
	if n, _ := stale.Shards(ctx, b.queue); n != 1 {
		t.Fatalf("the stale client already knows %d shards", n)
	}
	tasks := make([]Task, 40)
	for i := range tasks {
		tasks[i] = Task{ID: fmt.Sprintf("t-%d", i), Payload: []byte("p")}
	}
	if _, err := stale.Enqueue(ctx, b.queue, tasks...); err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if _, err := b.rdb.ZScore(ctx, l[ShardOf(task.ID, 4)].Ready, task.ID).Result(); err != nil {
			t.Fatalf("%s not in its shard %d: %v", task.ID, ShardOf(task.ID, 4), err)
		}
	}
	// Back to 2 shards: the old layout's shards 1..3 hold the new count, so an
	// enqueue routed by 4 is refused there as well.
	if _, err := b.c.SetControls(ctx, b.queue, 2, Controls{Shards: 2}); err != nil {
		t.Fatal(err)
	}
	for _, k := range l {
		if n, _ := b.rdb.HGet(ctx, k.Control, "n").Result(); n != "2" {
			t.Errorf("%s holds n %q, want 2", k.Control, n)
		}
	}
	ctl, v, err := b.c.Controls(ctx, b.queue)
	if err != nil || ctl.Shards != 2 || v != 2 {
		t.Fatalf("Controls = %+v, %d, %v", ctl, v, err)
	}
}

// TestShardedControls: every shard holds the pause and its share of the rate
// limit; Controls reports the queue's whole limit and the oldest version of any
// shard, so that a shard whose controls were lost is written again.
func TestShardedControls(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	rate := RateLimit{Limit: 300, Period: time.Second, Burst: 30}
	if _, err := b.c.SetControls(ctx, b.queue, 3, Controls{Paused: true, Rate: rate, Shards: 3}); err != nil {
		t.Fatal(err)
	}
	l, _ := b.c.layout(b.queue, 3)
	for _, k := range l {
		f, err := b.rdb.HMGet(ctx, k.Control, "p", "r", "w", "b", "n").Result()
		if err != nil || !slices.Equal(f, []any{"1", "300", "1000", "30", "3"}) {
			t.Fatalf("%s = %v, %v", k.Control, f, err)
		}
	}
	ctl, v, err := b.c.Controls(ctx, b.queue)
	if err != nil || v != 3 || ctl != (Controls{Paused: true, Rate: rate, Shards: 3}) {
		t.Fatalf("Controls = %+v, %d, %v", ctl, v, err)
	}
	if _, err := b.c.Enqueue(ctx, b.queue, Task{ID: "a", Payload: []byte("p")}, Task{ID: "b", Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	if cl, err := b.c.Claim(ctx, b.queue, 10, time.Minute); err != nil || len(cl.Tasks) != 0 || cl.NextDue != -1 {
		t.Fatalf("claim while paused: %+v, %v", cl, err)
	}
	if err := b.rdb.Del(ctx, l[2].Control).Err(); err != nil {
		t.Fatal(err)
	}
	if _, v, _ := b.c.Controls(ctx, b.queue); v != 0 {
		t.Fatalf("version %d with a shard's controls lost, want 0", v)
	}
	if applied, err := b.c.SetControls(ctx, b.queue, 3, Controls{Paused: true, Rate: rate, Shards: 3}); err != nil || !applied {
		t.Fatalf("SetControls again = %v, %v; want applied to the shard behind", applied, err)
	}
	if p, _ := b.rdb.HGet(ctx, l[2].Control, "p").Result(); p != "1" {
		t.Fatalf("shard 2 paused %q after the mirror", p)
	}
	for _, n := range []int{-1, MaxShards + 1} {
		if _, err := b.c.SetControls(ctx, b.queue, 4, Controls{Shards: n}); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%d shards: %v, want ErrInvalidArgument", n, err)
		}
	}
	// Each shard takes its share of the limit: a burst of 3 over 3 shards starts
	// one task a shard at once.
	if _, err := b.c.SetControls(ctx, b.queue, 5, Controls{Rate: RateLimit{Limit: 3, Period: time.Second, Burst: 3}}); err != nil {
		t.Fatal(err)
	}
	many := make([]Task, 30)
	for i := range many {
		many[i] = Task{ID: fmt.Sprintf("r-%d", i), Payload: []byte("p")}
	}
	if _, err := b.c.Enqueue(ctx, b.queue, many...); err != nil {
		t.Fatal(err)
	}
	cl, err := b.c.Claim(ctx, b.queue, 30, time.Minute)
	if err != nil || len(cl.Tasks) != 3 || cl.NextDue != 0 || cl.RateWait <= 0 || cl.RateWait > time.Second {
		t.Fatalf("claim under a limit of burst 3 over 3 shards: %d tasks, next %v, rate wait %v, %v; want 3 and a wait of up to 1s",
			len(cl.Tasks), cl.NextDue, cl.RateWait, err)
	}
	// A resume that leaves Shards 0 keeps the count.
	if _, err := b.c.SetControls(ctx, b.queue, 6, Controls{}); err != nil {
		t.Fatal(err)
	}
	if ctl, v, err := b.c.Controls(ctx, b.queue); err != nil || v != 6 || ctl != (Controls{Shards: 3}) {
		t.Fatalf("after a resume without a count: %+v, %d, %v; want 3 shards kept", ctl, v, err)
	}
}

// TestRoutedByCallersCount: the relay's calls route by the count they are given
// (Postgres's), not by the count Redis holds or has lost. With the controls lost
// (no n), a Client that finds no count would take 1 shard: EnqueuePipelined with
// QueueTasks.Shards and RepairIfRouted still put each task into ShardOf(id, 3),
// and ProbeRouted finds it there. A shard holding another count refuses such a
// call with ErrShardCount, nothing written, and does not route it anew.
func TestRoutedByCallersCount(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	l, err := b.c.layout(b.queue, 3)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := b.c.Shards(ctx, b.queue); err != nil || n != 1 {
		t.Fatalf("Shards = %d, %v; want 1 (no controls)", n, err)
	}
	var tasks []Task
	for i := range 12 {
		tasks = append(tasks, Task{ID: fmt.Sprintf("t%02d", i), Payload: []byte("p"), Version: 1})
	}
	where := func(id string) []int {
		var in []int
		for k, key := range l {
			if n, _ := b.rdb.Exists(ctx, key.TaskKey(id)).Result(); n == 1 {
				in = append(in, k)
			}
		}
		return in
	}
	if _, err := b.c.EnqueuePipelined(ctx, []QueueTasks{{Queue: b.queue, Tasks: tasks[:6], Shards: 3}}); err != nil {
		t.Fatal(err)
	}
	// The rest restored by repairs, as self-healing does after a loss.
	var repairs []Repair
	rest := make([]string, 0, 6)
	for _, tk := range tasks[6:] {
		rest = append(rest, tk.ID)
	}
	_, probes, err := b.c.ProbeRouted(ctx, b.queue, 3, rest...)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range probes {
		repairs = append(repairs, Repair{Op: RepairRestore, ID: p.ID, Fingerprint: p.Fingerprint, Task: tasks[6+i]})
	}
	applied, err := b.c.RepairIfRouted(ctx, b.queue, 3, repairs...)
	if err != nil || slices.Contains(applied, false) {
		t.Fatalf("RepairIfRouted = %v, %v", applied, err)
	}
	for _, tk := range tasks {
		if in := where(tk.ID); !slices.Equal(in, []int{ShardOf(tk.ID, 3)}) {
			t.Errorf("%s in shards %v, want only %d", tk.ID, in, ShardOf(tk.ID, 3))
		}
	}
	_, probes, err = b.c.ProbeRouted(ctx, b.queue, 3, "t00", "t07")
	if err != nil || probes[0].State != StateReady || probes[1].State != StateReady {
		t.Errorf("ProbeRouted = %+v, %v; want both ready", probes, err)
	}

	// Controls that hold another count refuse the call: nothing written.
	if _, err := b.c.SetControls(ctx, b.queue, 1, Controls{Shards: 2}); err != nil {
		t.Fatal(err)
	}
	fresh := []Task{{ID: "late-1"}, {ID: "late-2"}, {ID: "late-3"}, {ID: "late-4"}}
	_, err = b.c.EnqueuePipelined(ctx, []QueueTasks{{Queue: b.queue, Tasks: fresh, Shards: 3}})
	if !errors.Is(err, ErrShardCount) || !strings.Contains(err.Error(), "Redis holds 2") {
		t.Fatalf("EnqueuePipelined over 2 shards held = %v, want ErrShardCount naming 2", err)
	}
	for _, tk := range fresh {
		if in := where(tk.ID); len(in) > 0 && in[0] == 0 {
			// Shard 0 holds n 2: refused, nothing written there.
			t.Errorf("%s written into shard 0, which holds another count", tk.ID)
		}
	}
	if _, err := b.c.EnqueuePipelined(ctx, []QueueTasks{{Queue: b.queue, Tasks: fresh, Shards: 65}}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("65 shards: %v, want ErrInvalidArgument", err)
	}
}
