package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestNewConfig(t *testing.T) {
	t.Parallel()
	rdb, _ := setupRedisOnly(t)
	for _, cfg := range []Config{
		{Prefix: "a{b"},
		{DoneRetention: -2},
		{DefaultMaxAttempts: -1},
		{EnqueueBatch: 10001},
		{ReapBackoffBase: time.Second, ReapBackoffMax: time.Millisecond},
	} {
		if _, err := New(rdb, cfg); err == nil {
			t.Errorf("New(%+v): no error", cfg)
		}
	}
	if _, err := New(nil, Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New(nil): %v", err)
	}
	c, err := New(rdb, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Config(); got.Prefix != "dq" || got.DoneRetention != -1 || got.DefaultMaxAttempts != 25 {
		t.Errorf("defaults: %+v", got)
	}
}

func TestEnqueueClaimComplete(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DoneRetention: 7 * 24 * time.Hour})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	st := b.enqueue(t,
		Task{ID: "a", Payload: []byte("pa"), RunAt: now.Add(-2 * time.Second)},
		Task{ID: "b", Payload: []byte("pb"), RunAt: now.Add(-time.Second), MaxAttempts: 3, Version: 4},
		Task{ID: "c", Payload: []byte("pc"), RunAt: now.Add(time.Hour)},
	)
	if !slices.Equal(st, []EnqueueStatus{Added, Added, Added}) {
		t.Fatalf("statuses %v", st)
	}
	cl := b.claim(t, 10, time.Minute)
	if len(cl.Tasks) != 2 || cl.Tasks[0].ID != "a" || cl.Tasks[1].ID != "b" {
		t.Fatalf("claimed %+v", cl.Tasks)
	}
	// Due times round up to the ms and the claim's clock down: up to 1h + 1ms.
	if cl.NextDue < 59*time.Minute || cl.NextDue > time.Hour+time.Millisecond {
		t.Errorf("NextDue %v, want about 1h", cl.NextDue)
	}
	tb := cl.Tasks[1]
	if string(tb.Payload) != "pb" || tb.Attempt != 1 || tb.MaxAttempts != 3 || tb.Version != 4 || tb.Queue != "q" ||
		tb.Token == "" || tb.Token == cl.Tasks[0].Token {
		t.Errorf("task b %+v", tb)
	}
	if want := ceilMilli(now.Add(-time.Second)); !tb.Due.Equal(want) {
		t.Errorf("Due %v, want %v", tb.Due, want)
	}
	if d := tb.LeaseUntil.Sub(cl.Now); d != time.Minute {
		t.Errorf("lease %v, want 1m", d)
	}
	if cl.Tasks[0].MaxAttempts != 25 || cl.Tasks[0].Version != 1 {
		t.Errorf("defaults not applied: %+v", cl.Tasks[0])
	}
	if err := b.c.Complete(ctx, "q", "b", tb.Token); err != nil {
		t.Fatal(err)
	}
	ti := b.info(t, "b")
	if ti.State != StateDone || ti.Payload != nil || ti.TTL < 6*24*time.Hour || ti.Version != tb.Version || ti.Attempt != 0 {
		t.Errorf("done task %+v", ti)
	}
	if err := b.c.Complete(ctx, "q", "b", tb.Token); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("second Complete: %v", err)
	}
	s, err := b.c.Stats(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	if s.Ready != 1 || s.DueNow != 0 || s.Active != 1 || s.Dead != 0 || s.OldestLateness != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestEnqueueZeroRunAtIsRedisNow(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	before := redisNow(t, b.rdb).Truncate(time.Millisecond)
	b.enqueue(t, Task{ID: "x"})
	after := redisNow(t, b.rdb)
	ti := b.info(t, "x")
	if ti.Score.Before(before) || ti.Score.After(after) {
		t.Errorf("score %v not within [%v, %v]", ti.Score, before, after)
	}
}

func TestEnqueueDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	task := Task{ID: "d", Payload: []byte("one"), RunAt: now.Add(-time.Second), MaxAttempts: 1}
	if st := b.enqueue(t, task, task); !slices.Equal(st, []EnqueueStatus{Added, Duplicate}) {
		t.Fatalf("statuses %v", st)
	}
	snap := b.snapshot(t)
	other := task
	other.Payload, other.RunAt = []byte("two"), now.Add(time.Hour)
	if st := b.enqueue(t, other); st[0] != Duplicate {
		t.Fatalf("status %v", st)
	}
	sameSnapshot(t, "duplicate of ready", snap, b.snapshot(t))

	// Active, dead and done tasks are duplicates too.
	cl := b.claim(t, 1, time.Minute)
	snap = b.snapshot(t)
	if st := b.enqueue(t, other); st[0] != Duplicate {
		t.Fatalf("active: status %v", st)
	}
	sameSnapshot(t, "duplicate of active", snap, b.snapshot(t))
	if dead, err := b.c.Retry(ctx, "q", "d", cl.Tasks[0].Token, time.Second, "boom"); err != nil || !dead {
		t.Fatalf("Retry: dead=%v err=%v", dead, err)
	}
	snap = b.snapshot(t)
	if st := b.enqueue(t, Task{ID: "d"}); st[0] != Duplicate {
		t.Fatalf("dead: status %v", st)
	}
	sameSnapshot(t, "duplicate of dead", snap, b.snapshot(t))

	// A higher version is a reschedule the outbox accepted: it brings the task back
	// from dead (Postgres, not Redis, decides that it is not finished).
	if st := b.enqueue(t, Task{ID: "d", Version: 9, RunAt: now.Add(time.Hour)}); st[0] != Replaced {
		t.Fatalf("dead, higher version: status %v", st)
	}
	if ti := b.info(t, "d"); ti.State != StateReady || ti.Version != 9 || ti.LastError != "" {
		t.Fatalf("after replacing a dead task: %+v", ti)
	}
	if n := b.rdb.ZCard(ctx, b.k.Dead).Val(); n != 0 {
		t.Fatalf("dead ZSET holds %d after the replace", n)
	}
}

// TestEnqueueReplacesDoneOlderVersion: a worker may finish version 1 in Redis
// (its outbox guard refused it: the row was rescheduled meanwhile) just before the
// relay moves version 2. Version 2 must run, not be taken for a duplicate.
func TestEnqueueReplacesDoneOlderVersion(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DoneRetention: time.Hour})
	ctx := ctxT(t)
	b.enqueue(t, Task{ID: "v"})
	cl := b.claim(t, 1, time.Minute)
	if err := b.c.Complete(ctx, "q", "v", cl.Tasks[0].Token); err != nil {
		t.Fatal(err)
	}
	if st := b.enqueue(t, Task{ID: "v"}); st[0] != Duplicate {
		t.Fatalf("same version after done: %v", st)
	}
	if st := b.enqueue(t, Task{ID: "v", Version: 2}); st[0] != Replaced {
		t.Fatalf("higher version after done: %v", st)
	}
	ti := b.info(t, "v")
	if ti.State != StateReady || ti.Version != 2 || ti.TTL > 0 {
		t.Fatalf("after replacing a done task: %+v (want ready, version 2, no TTL)", ti)
	}
}

func TestEnqueueAfterRetention(t *testing.T) {
	t.Parallel()
	const retention = time.Minute // long enough for the check within it, whatever the load
	b := setup(t, Config{DoneRetention: retention})
	ctx := ctxT(t)
	b.enqueue(t, Task{ID: "r"})
	cl := b.claim(t, 1, time.Minute)
	if err := b.c.Complete(ctx, "q", "r", cl.Tasks[0].Token); err != nil {
		t.Fatal(err)
	}
	if st := b.enqueue(t, Task{ID: "r"}); st[0] != Duplicate {
		t.Fatalf("within retention: %v", st)
	}
	// The retention is a Redis TTL on the done hash: shorten it to what is left
	// at the end of the retention, and wait for Redis to expire the hash.
	if ttl := b.rdb.PTTL(ctx, b.k.TaskKey("r")).Val(); ttl <= 0 || ttl > retention {
		t.Fatalf("done hash TTL %v, want the retention %v", ttl, retention)
	}
	if err := b.rdb.PExpire(ctx, b.k.TaskKey("r"), time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	for b.rdb.Exists(ctx, b.k.TaskKey("r")).Val() == 1 {
		if ctx.Err() != nil {
			t.Fatal("done hash never expired")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := b.enqueue(t, Task{ID: "r", Payload: []byte("again")}); st[0] != Added {
		t.Fatalf("after retention: %v", st)
	}
	if got := b.claim(t, 1, time.Minute); len(got.Tasks) != 1 || string(got.Tasks[0].Payload) != "again" || got.Tasks[0].Attempt != 1 {
		t.Fatalf("claim after retention: %+v", got)
	}
}

func TestCompleteWithoutRetentionDeletes(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DoneRetention: -1})
	b.enqueue(t, Task{ID: "t"})
	cl := b.claim(t, 1, time.Minute)
	if err := b.c.Complete(ctxT(t), "q", "t", cl.Tasks[0].Token); err != nil {
		t.Fatal(err)
	}
	// Only the queue registry stays (the reaper's list of queues to visit), and
	// the queue's history of the minute.
	snap := b.withoutHistory(b.snapshot(t))
	if _, ok := snap[registryKey(b.prefix)]; !ok {
		t.Errorf("no queue registry")
	}
	delete(snap, registryKey(b.prefix))
	if len(snap) != 0 {
		t.Errorf("keys left: %v", snap)
	}
	if qs, err := b.c.RegisteredQueues(ctxT(t)); err != nil || !slices.Equal(qs, []string{"q"}) {
		t.Errorf("registered queues %v %v", qs, err)
	}
}

// CompleteMany settles each lease on its own: good tokens complete, a stale token
// and a task completed before are reported lost and left as they were, and more
// than one call's worth (1,000) is split without losing order.
func TestCompleteMany(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	leases := b.leases(t, "m", 1003)
	if err := b.c.Complete(ctx, "q", leases[5].ID, leases[5].Token); err != nil {
		t.Fatal(err)
	}
	leases[7].Token = "stale.1"
	before := b.info(t, leases[7].ID)

	done, err := b.c.CompleteMany(ctx, "q", leases)
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != len(leases) {
		t.Fatalf("%d results for %d leases", len(done), len(leases))
	}
	for i, d := range done {
		if want := i != 5 && i != 7; d != want {
			t.Errorf("lease %d (%s): done %v, want %v", i, leases[i].ID, d, want)
		}
	}
	if after := b.info(t, leases[7].ID); after.State != StateActive || after.Attempt != before.Attempt {
		t.Errorf("stale lease changed its task: %+v -> %+v", before, after)
	}
	if n := b.rdb.ZCard(ctx, b.k.Active).Val(); n != 1 {
		t.Errorf("active holds %d, want only the stale lease's task", n)
	}
	if ti := b.info(t, leases[1002].ID); ti.State != StateMissing {
		t.Errorf("last task (second call): %+v, want deleted (no done retention by default)", ti)
	}
}

// leases enqueues n tasks due now (ids prefix-0000...) and claims them all for a
// minute, in id order.
func (b *testBundle) leases(t *testing.T, prefix string, n int) []Lease {
	t.Helper()
	now := redisNow(t, b.rdb)
	tasks := make([]Task, n)
	for i := range tasks {
		tasks[i] = Task{ID: fmt.Sprintf("%s-%04d", prefix, i), RunAt: now.Add(-time.Second)}
	}
	b.enqueue(t, tasks...)
	var leases []Lease
	for len(leases) < n {
		for _, ct := range b.claim(t, 1000, time.Minute).Tasks {
			leases = append(leases, Lease{ID: ct.ID, Token: ct.Token})
		}
	}
	return leases
}

// A malformed lease anywhere in the batch is refused before anything is written.
func TestCompleteManyInvalidWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.enqueue(t, Task{ID: "a", RunAt: now.Add(-time.Second)})
	good := b.claim(t, 1, time.Minute).Tasks[0]
	snap := b.snapshot(t)
	for _, bad := range []Lease{{ID: "", Token: "x"}, {ID: "b", Token: ""}, {ID: "{b}", Token: "x"}} {
		_, err := b.c.CompleteMany(ctx, "q", []Lease{{ID: good.ID, Token: good.Token}, bad})
		if !errors.Is(err, ErrInvalidArgument) && !errors.Is(err, ErrInvalidTaskID) {
			t.Errorf("lease %+v: %v", bad, err)
		}
	}
	if _, err := b.c.CompleteMany(ctx, "bad queue", []Lease{{ID: good.ID, Token: good.Token}}); !errors.Is(err, ErrInvalidQueue) {
		t.Errorf("bad queue: %v", err)
	}
	sameSnapshot(t, "after refused batches", snap, b.snapshot(t))
	if done, err := b.c.CompleteMany(ctx, "q", nil); err != nil || len(done) != 0 {
		t.Errorf("empty batch: %v %v", done, err)
	}
}

func TestExtendMany(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	leases := b.leases(t, "x", 1003)
	// Refused: a completed task, a stale token, a task removed, a task released
	// and claimed again (another token); the first and the last call's are renewed.
	if err := b.c.Complete(ctx, "q", leases[5].ID, leases[5].Token); err != nil {
		t.Fatal(err)
	}
	leases[7].Token = "stale.1"
	if _, err := b.c.Remove(ctx, "q", leases[9].ID); err != nil {
		t.Fatal(err)
	}
	before := b.info(t, leases[7].ID)
	if err := b.c.Release(ctx, "q", leases[1001].ID, leases[1001].Token); err != nil {
		t.Fatal(err)
	}
	if cl := b.claim(t, 1, time.Minute); len(cl.Tasks) != 1 || cl.Tasks[0].ID != leases[1001].ID {
		t.Fatalf("claim again: %+v", cl)
	}

	renewed, err := b.c.ExtendMany(ctx, "q", leases, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(renewed) != len(leases) {
		t.Fatalf("%d results for %d leases", len(renewed), len(leases))
	}
	refused := map[int]bool{5: true, 7: true, 9: true, 1001: true}
	for i, r := range renewed {
		if r == refused[i] {
			t.Errorf("lease %d (%s): renewed %v, want %v", i, leases[i].ID, r, !refused[i])
		}
	}
	soon := float64(now.Add(2 * time.Minute).Unix())
	for _, i := range []int{0, 1000, 1002} {
		if s := b.rdb.ZScore(ctx, b.k.Active, leases[i].ID).Val(); s < soon {
			t.Errorf("lease %d not renewed: deadline %v", i, s)
		}
	}
	for _, i := range []int{7, 1001} {
		if s := b.rdb.ZScore(ctx, b.k.Active, leases[i].ID).Val(); s > soon {
			t.Errorf("refused lease %d renewed: deadline %v", i, s)
		}
	}
	if after := b.info(t, leases[7].ID); after.State != StateActive || after.Attempt != before.Attempt || !after.Score.Equal(before.Score) {
		t.Errorf("stale lease changed its task: %+v -> %+v", before, after)
	}
	if ti := b.info(t, leases[5].ID); ti.State != StateMissing {
		t.Errorf("completed task after extend: %+v", ti)
	}
	if ti := b.info(t, leases[9].ID); ti.State != StateMissing {
		t.Errorf("removed task after extend: %+v", ti)
	}
}

// A malformed lease anywhere in the batch, or a bad duration, is refused before
// anything is written.
func TestExtendManyInvalidWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.enqueue(t, Task{ID: "a", RunAt: now.Add(-time.Second)}, Task{ID: "b", RunAt: now.Add(-time.Second)})
	cl := b.claim(t, 2, time.Minute)
	good := []Lease{{ID: cl.Tasks[0].ID, Token: cl.Tasks[0].Token}, {ID: cl.Tasks[1].ID, Token: cl.Tasks[1].Token}}
	snap := b.snapshot(t)
	for _, bad := range []Lease{{ID: "", Token: "x"}, {ID: "b", Token: ""}, {ID: "{b}", Token: "x"}, {ID: "b", Token: strings.Repeat("t", 101)}} {
		_, err := b.c.ExtendMany(ctx, "q", append(slices.Clone(good), bad), time.Hour)
		if !errors.Is(err, ErrInvalidArgument) && !errors.Is(err, ErrInvalidTaskID) {
			t.Errorf("lease %+v: %v", bad, err)
		}
	}
	for _, d := range []time.Duration{0, -time.Second, (1<<40 + 1) * time.Millisecond} {
		if _, err := b.c.ExtendMany(ctx, "q", good, d); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("lease %v: %v", d, err)
		}
	}
	if _, err := b.c.ExtendMany(ctx, "bad queue", good, time.Hour); !errors.Is(err, ErrInvalidQueue) {
		t.Errorf("bad queue: %v", err)
	}
	sameSnapshot(t, "after refused batches", snap, b.snapshot(t))
	if r, err := b.c.ExtendMany(ctx, "q", nil, time.Hour); err != nil || len(r) != 0 {
		t.Errorf("empty batch: %v %v", r, err)
	}
}

func TestEnqueueHigherVersionReplaces(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.enqueue(t, Task{ID: "v", Payload: []byte("v1"), RunAt: now.Add(-time.Second)})
	cl := b.claim(t, 1, time.Minute)

	later := now.Add(time.Hour)
	if st := b.enqueue(t, Task{ID: "v", Payload: []byte("v2"), RunAt: later, Version: 2}); st[0] != Replaced {
		t.Fatalf("status %v", st)
	}
	if err := b.c.Complete(ctx, "q", "v", cl.Tasks[0].Token); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("old lease after reschedule: %v", err)
	}
	ti := b.info(t, "v")
	if ti.State != StateReady || string(ti.Payload) != "v2" || ti.Version != 2 || !ti.Score.Equal(ceilMilli(later)) {
		t.Errorf("rescheduled %+v", ti)
	}
	if n := b.rdb.ZCard(ctx, b.k.Active).Val(); n != 0 {
		t.Errorf("active has %d", n)
	}
	// Same or lower version: duplicate; the ready task's score moves with a higher one.
	if st := b.enqueue(t, Task{ID: "v", Version: 2}, Task{ID: "v", Version: 1}); !slices.Equal(st, []EnqueueStatus{Duplicate, Duplicate}) {
		t.Errorf("statuses %v", st)
	}
	if st := b.enqueue(t, Task{ID: "v", RunAt: now.Add(-time.Second), Version: 3}); st[0] != Replaced {
		t.Errorf("status %v", st)
	}
	if got := b.claim(t, 1, time.Minute); len(got.Tasks) != 1 || got.Tasks[0].Version != 3 || got.Tasks[0].Attempt != 1 {
		t.Errorf("claim %+v, want version 3 at attempt 1 (the revoked run does not count)", got)
	}
	// The replacement carries the outbox's attempts (recorded failures).
	if st := b.enqueue(t, Task{ID: "v", RunAt: now.Add(-time.Second), Version: 4, Attempt: 2}); st[0] != Replaced {
		t.Errorf("status %v", st)
	}
	if got := b.claim(t, 1, time.Minute); len(got.Tasks) != 1 || got.Tasks[0].Attempt != 3 {
		t.Errorf("claim %+v, want attempt 3", got)
	}
}

func TestEnqueueBatches(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{EnqueueBatch: 7})
	var tasks []Task
	for i := range 50 {
		tasks = append(tasks, Task{ID: fmt.Sprintf("id-%02d", i%40)})
	}
	st := b.enqueue(t, tasks...)
	if len(st) != 50 {
		t.Fatalf("%d statuses", len(st))
	}
	for i, s := range st {
		if want := map[bool]EnqueueStatus{true: Added, false: Duplicate}[i < 40]; s != want {
			t.Errorf("task %d: %v, want %v", i, s, want)
		}
	}
	if n := b.rdb.ZCard(ctxT(t), b.k.Ready).Val(); n != 40 {
		t.Errorf("ready %d", n)
	}
}

func TestInvalidInputWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxPayloadBytes: 10})
	ctx := ctxT(t)
	good := Task{ID: "ok"}
	for _, tc := range []struct {
		queue string
		task  Task
		want  error
	}{
		{"", good, ErrInvalidQueue},
		{"a{b}", good, ErrInvalidQueue},
		{"q", Task{ID: ""}, ErrInvalidTaskID},
		{"q", Task{ID: "x}y"}, ErrInvalidTaskID},
		{"q", Task{ID: strings.Repeat("x", 201)}, ErrInvalidTaskID},
		{"q", Task{ID: "p", Payload: make([]byte, 11)}, ErrInvalidTask},
		{"q", Task{ID: "p", MaxAttempts: -1}, ErrInvalidTask},
		{"q", Task{ID: "p", Attempt: -1}, ErrInvalidTask},
		{"q", Task{ID: "p", Version: -1}, ErrInvalidTask},
		{"q", Task{ID: "p", RunAt: time.Unix(-5, 0)}, ErrInvalidTask},
	} {
		if _, err := b.c.Enqueue(ctx, tc.queue, good, tc.task); !errors.Is(err, tc.want) {
			t.Errorf("Enqueue(%q, %+v): %v, want %v", tc.queue, tc.task, err, tc.want)
		}
	}
	if snap := b.snapshot(t); len(snap) != 0 {
		t.Errorf("keys written: %v", snap)
	}
	for name, err := range map[string]error{
		"claim max 0":    func() error { _, err := b.c.Claim(ctx, "q", 0, time.Second); return err }(),
		"claim lease 0":  func() error { _, err := b.c.Claim(ctx, "q", 1, 0); return err }(),
		"retry delay 0":  func() error { _, err := b.c.Retry(ctx, "q", "id", "tok", 0, ""); return err }(),
		"extend lease 0": b.c.Extend(ctx, "q", "id", "tok", 0),
		"reap limit 0":   func() error { _, err := b.c.Reap(ctx, "q", 0); return err }(),
		"empty token":    b.c.Complete(ctx, "q", "id", ""),
	} {
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestConcurrentClaimers: 8 claimers over 10,000 tasks, due from a second ago to a
// second ahead: each task is claimed exactly once, none before its due time by the
// Redis clock.
func TestConcurrentClaimers(t *testing.T) {
	t.Parallel()
	const n, claimers = 10_000, 8
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	tasks := make([]Task, n)
	for i := range tasks {
		tasks[i] = Task{ID: fmt.Sprintf("t%05d", i), RunAt: now.Add(time.Duration(i%2000-1000) * time.Millisecond)}
	}
	b.enqueue(t, tasks...)

	w := b.c.NewWaiter()
	defer w.Close()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		mu      sync.Mutex
		claimed = make(map[string]int, n)
		errs    []error
		wg      sync.WaitGroup
	)
	fail := func(err error) {
		if runCtx.Err() == nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			stop()
		}
	}
	for range claimers {
		wg.Go(func() {
			for runCtx.Err() == nil {
				m, err := w.Mark(runCtx, "q")
				if err != nil {
					fail(err)
					return
				}
				cl, err := b.c.Claim(runCtx, "q", 25, time.Minute)
				if err != nil {
					fail(err)
					return
				}
				after, err := b.rdb.Time(runCtx).Result()
				if err != nil {
					fail(err)
					return
				}
				mu.Lock()
				for _, task := range cl.Tasks {
					claimed[task.ID]++
					if task.Due.After(cl.Now) || task.Due.After(after) {
						errs = append(errs, fmt.Errorf("%s claimed early: due %v, claim at %v, TIME after %v", task.ID, task.Due, cl.Now, after))
					}
				}
				if len(claimed) == n {
					stop() // every task is out: wake the others
				}
				mu.Unlock()
				if len(cl.Tasks) == 0 {
					if err := w.Wait(runCtx, m, cl.NextDue); err != nil {
						fail(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d errors, first: %v", len(errs), errs[0])
	}
	if len(claimed) != n {
		t.Fatalf("claimed %d distinct tasks, want %d", len(claimed), n)
	}
	for id, c := range claimed {
		if c != 1 {
			t.Errorf("%s claimed %d times", id, c)
		}
	}
	if s, _ := b.c.Stats(ctx, "q"); s.Ready != 0 || s.Active != n {
		t.Errorf("stats %+v", s)
	}
}

func TestStaleTokenChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	b.enqueue(t, Task{ID: "s", Payload: []byte("p"), MaxAttempts: 1})
	cl := b.claim(t, 1, time.Minute)
	stale := cl.Tasks[0].Token + "x"

	snap := b.snapshot(t)
	for name, err := range map[string]error{
		"complete": b.c.Complete(ctx, "q", "s", stale),
		"extend":   b.c.Extend(ctx, "q", "s", stale, time.Hour),
		"retry":    func() error { _, err := b.c.Retry(ctx, "q", "s", stale, time.Second, "e"); return err }(),
		"kill":     b.c.Kill(ctx, "q", "s", stale, "e"),
		"release":  b.c.Release(ctx, "q", "s", stale),
		"unknown":  b.c.Complete(ctx, "q", "nope", stale),
	} {
		if !errors.Is(err, ErrLeaseLost) {
			t.Errorf("%s with a stale token: %v", name, err)
		}
	}
	sameSnapshot(t, "stale tokens", snap, b.snapshot(t))

	// The real token still works, and a token from an earlier claim does not.
	if err := b.c.Extend(ctx, "q", "s", cl.Tasks[0].Token, time.Hour); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if s := b.rdb.ZScore(ctx, b.k.Active, "s").Val(); s < float64(cl.Now.Add(59*time.Minute).Unix()) {
		t.Errorf("lease not extended: %v", s)
	}
	if err := b.c.Release(ctx, "q", "s", cl.Tasks[0].Token); err != nil {
		t.Fatal(err)
	}
	again := b.claim(t, 1, time.Minute)
	if len(again.Tasks) != 1 || again.Tasks[0].Token == cl.Tasks[0].Token {
		t.Fatalf("reclaim %+v", again)
	}
	snap = b.snapshot(t)
	if err := b.c.Complete(ctx, "q", "s", cl.Tasks[0].Token); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("previous claim's token: %v", err)
	}
	sameSnapshot(t, "previous token", snap, b.snapshot(t))
}

func TestRetryAndDead(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	b.enqueue(t, Task{ID: "r", Payload: []byte("p"), MaxAttempts: 2})
	cl := b.claim(t, 1, time.Minute)
	dead, err := b.c.Retry(ctx, "q", "r", cl.Tasks[0].Token, 1500*time.Millisecond, "first failure")
	if err != nil || dead {
		t.Fatalf("Retry: dead=%v err=%v", dead, err)
	}
	ti := b.info(t, "r")
	after := redisNow(t, b.rdb)
	if ti.State != StateReady || ti.LastError != "first failure" || ti.Attempt != 1 {
		t.Errorf("after retry %+v", ti)
	}
	if d := ti.Score.Sub(cl.Now); d < 1500*time.Millisecond || ti.Score.Sub(after) > 1500*time.Millisecond {
		t.Errorf("retry score %v is not claim time + 1.5s (claimed at %v)", ti.Score, cl.Now)
	}
	if got := b.claim(t, 1, time.Minute); len(got.Tasks) != 0 || got.NextDue <= 0 {
		t.Fatalf("retried task claimable at once: %+v", got)
	}
	if err := b.rdb.ZAdd(ctx, b.k.Ready, redisZ("r", 1)).Err(); err != nil { // skip the wait
		t.Fatal(err)
	}
	cl = b.claim(t, 1, time.Minute)
	if cl.Tasks[0].Attempt != 2 {
		t.Fatalf("attempt %d", cl.Tasks[0].Attempt)
	}
	dead, err = b.c.Retry(ctx, "q", "r", cl.Tasks[0].Token, time.Second, strings.Repeat("e", 5000))
	if err != nil || !dead {
		t.Fatalf("Retry at max: dead=%v err=%v", dead, err)
	}
	ti = b.info(t, "r")
	if ti.State != StateDead || len(ti.LastError) != MaxErrorBytes || string(ti.Payload) != "p" {
		t.Errorf("dead %+v", ti)
	}
	if n := b.rdb.ZCard(ctx, b.k.Dead).Val(); n != 1 {
		t.Errorf("dead set %d", n)
	}

	// A person retries it: the relay enqueues the new version, which replaces the
	// dead one, due now with its runs reset.
	if st := b.enqueue(t, Task{ID: "r", Payload: []byte("p"), MaxAttempts: 2, Version: 2}); st[0] != Replaced {
		t.Fatalf("enqueue of version 2 over the dead task: %v", st)
	}
	cl = b.claim(t, 1, time.Minute)
	if len(cl.Tasks) != 1 || cl.Tasks[0].Attempt != 1 {
		t.Fatalf("requeued claim %+v", cl)
	}
	if err := b.c.Kill(ctx, "q", "r", cl.Tasks[0].Token, "bad payload"); err != nil {
		t.Fatal(err)
	}
	if ti := b.info(t, "r"); ti.State != StateDead || ti.LastError != "bad payload" {
		t.Errorf("killed %+v", ti)
	}
}

func TestReleaseDoesNotCountTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.enqueue(t, Task{ID: "x", RunAt: now.Add(-time.Hour)}, Task{ID: "y", RunAt: now.Add(time.Hour)})
	cl := b.claim(t, 1, time.Minute)
	if err := b.c.Release(ctx, "q", "x", cl.Tasks[0].Token); err != nil {
		t.Fatal(err)
	}
	if ti := b.info(t, "x"); ti.State != StateReady || ti.Attempt != 0 {
		t.Errorf("released %+v", ti)
	}
	cl = b.claim(t, 1, time.Minute)
	if len(cl.Tasks) != 1 || cl.Tasks[0].Attempt != 1 {
		t.Errorf("reclaimed %+v", cl)
	}
}

// ReleaseAfter (a snooze) gives the lease back due after the delay, uncounted.
func TestReleaseAfter(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.enqueue(t, Task{ID: "x", RunAt: now.Add(-time.Hour)})
	cl := b.claim(t, 1, time.Minute)
	if err := b.c.ReleaseAfter(ctx, "q", "x", cl.Tasks[0].Token, -time.Second); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("negative delay: %v", err)
	}
	before := redisNow(t, b.rdb)
	if err := b.c.ReleaseAfter(ctx, "q", "x", cl.Tasks[0].Token, time.Hour+time.Microsecond); err != nil {
		t.Fatal(err)
	}
	after := redisNow(t, b.rdb)
	ti := b.info(t, "x")
	if ti.State != StateReady || ti.Attempt != 0 || ti.Score.Before(before.Add(time.Hour+time.Millisecond)) || ti.Score.After(after.Add(time.Hour+time.Millisecond)) {
		t.Errorf("released for an hour: %+v (between %v and %v)", ti, before, after)
	}
	if err := b.c.ReleaseAfter(ctx, "q", "x", cl.Tasks[0].Token, time.Second); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("second release: %v", err)
	}
}

func TestReap(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{ReapBackoffBase: 2 * time.Second, ReapBackoffMax: time.Minute})
	ctx := ctxT(t)
	b.enqueue(t, Task{ID: "again", Payload: []byte("p1"), MaxAttempts: 3}, Task{ID: "last", Payload: []byte("p2"), MaxAttempts: 1})
	cl := b.claim(t, 10, time.Hour)
	if len(cl.Tasks) != 2 {
		t.Fatalf("claimed %d", len(cl.Tasks))
	}
	// Not expired: nothing to reap.
	if r, err := b.c.Reap(ctx, "q", 100); err != nil || len(r.Requeued)+len(r.Exhausted)+len(r.Orphans) != 0 {
		t.Fatalf("Reap before expiry: %+v %v", r, err)
	}
	// The leases run out (set the deadlines into the past instead of sleeping an
	// hour), and a member whose hash vanished sits in active.
	for _, id := range []string{"again", "last", "ghost"} {
		if err := b.rdb.ZAdd(ctx, b.k.Active, redisZ(id, 1)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if s, _ := b.c.Stats(ctx, "q"); s.ExpiredLeases != 3 {
		t.Errorf("stats before reap %+v", s)
	}
	before := redisNow(t, b.rdb)
	r, err := b.c.Reap(ctx, "q", 100)
	if err != nil {
		t.Fatal(err)
	}
	after := redisNow(t, b.rdb)
	if !slices.Equal(r.Requeued, []string{"again"}) || !slices.Equal(r.Exhausted, []string{"last"}) || !slices.Equal(r.Orphans, []string{"ghost"}) {
		t.Fatalf("reap %+v", r)
	}
	ti := b.info(t, "again")
	// attempt 1, base 2s: backoff in [1s, 2s] after the reap.
	if ti.State != StateReady || ti.Score.Before(before.Add(time.Second-time.Millisecond)) || ti.Score.After(after.Add(2*time.Second)) {
		t.Errorf("requeued %+v, reaped between %v and %v", ti, before, after)
	}
	// Out of attempts: not dead in Redis first. It stays active, its lease revoked,
	// held for ExhaustedHold while the caller writes Postgres, then reported again.
	ti = b.info(t, "last")
	if ti.State != StateActive || string(ti.Payload) != "p2" || ti.Attempt != 1 ||
		ti.Score.Before(before.Add(ExhaustedHold)) || ti.Score.After(after.Add(ExhaustedHold)) {
		t.Errorf("exhausted %+v, want active until reap time + %v", ti, ExhaustedHold)
	}
	if n := b.rdb.ZCard(ctx, b.k.Active).Val(); n != 1 {
		t.Errorf("active holds %d, want the exhausted task only", n)
	}
	if r, err := b.c.Reap(ctx, "q", 100); err != nil || len(r.Exhausted) != 0 {
		t.Errorf("reap within the hold: %+v %v", r, err)
	}
	b.rdb.ZAdd(ctx, b.k.Active, redisZ("last", 1)) // the hold runs out
	if r, err := b.c.Reap(ctx, "q", 100); err != nil || !slices.Equal(r.Exhausted, []string{"last"}) {
		t.Errorf("reap after the hold: %+v %v", r, err)
	}
	// The caller settles it once Postgres says dead.
	_, probes, err := b.c.Probe(ctx, "q", "last")
	if err != nil {
		t.Fatal(err)
	}
	applied, err := b.c.RepairIf(ctx, "q", Repair{Op: RepairKill, ID: "last", Fingerprint: probes[0].Fingerprint, Error: "lease expired"})
	if err != nil || !applied[0] {
		t.Fatalf("kill: %v %v", applied, err)
	}
	ti = b.info(t, "last")
	if ti.State != StateDead || ti.LastError != "lease expired" || string(ti.Payload) != "p2" {
		t.Errorf("killed %+v", ti)
	}
	if n := b.rdb.ZCard(ctx, b.k.Active).Val(); n != 0 {
		t.Errorf("active left %d", n)
	}
	for _, task := range cl.Tasks {
		if err := b.c.Complete(ctx, "q", task.ID, task.Token); !errors.Is(err, ErrLeaseLost) {
			t.Errorf("Complete %s after reap: %v", task.ID, err)
		}
	}
}

func TestReapBackoffCapped(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{ReapBackoffBase: time.Second, ReapBackoffMax: 3 * time.Second})
	ctx := ctxT(t)
	b.enqueue(t, Task{ID: "x", Attempt: 30, MaxAttempts: 100})
	b.claim(t, 1, time.Hour)
	b.rdb.ZAdd(ctx, b.k.Active, redisZ("x", 1))
	before := redisNow(t, b.rdb)
	if r, err := b.c.Reap(ctx, "q", 1); err != nil || len(r.Requeued) != 1 {
		t.Fatalf("reap %+v %v", r, err)
	}
	after := redisNow(t, b.rdb)
	ti := b.info(t, "x")
	if ti.Attempt != 31 || ti.Score.Before(before.Add(1500*time.Millisecond-time.Millisecond)) || ti.Score.After(after.Add(3*time.Second)) {
		t.Errorf("capped backoff: %+v (reap at %v)", ti, before)
	}
}

func TestRemove(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	b.enqueue(t, Task{ID: "a"}, Task{ID: "b"})
	cl := b.claim(t, 1, time.Minute)
	for _, id := range []string{"a", "b"} {
		if ok, err := b.c.Remove(ctx, "q", id); err != nil || !ok {
			t.Errorf("Remove %s: %v %v", id, ok, err)
		}
	}
	if ok, err := b.c.Remove(ctx, "q", "a"); err != nil || ok {
		t.Errorf("Remove again: %v %v", ok, err)
	}
	snap := b.withoutHistory(b.snapshot(t))
	delete(snap, registryKey(b.prefix))
	if len(snap) != 0 {
		t.Errorf("left %v", snap)
	}
	if err := b.c.Complete(ctx, "q", cl.Tasks[0].ID, cl.Tasks[0].Token); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("Complete after Remove: %v", err)
	}
	if st := b.enqueue(t, Task{ID: "a"}); st[0] != Added {
		t.Errorf("enqueue after remove %v", st)
	}
}

func TestStatsLateness(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.enqueue(t, Task{ID: "late", RunAt: now.Add(-5 * time.Second)}, Task{ID: "due", RunAt: now}, Task{ID: "later", RunAt: now.Add(time.Hour)})
	s, err := b.c.Stats(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	if s.Ready != 3 || s.DueNow != 2 || s.OldestLateness < 5*time.Second || s.OldestLateness > 10*time.Second {
		t.Errorf("stats %+v", s)
	}
}

func TestOrphanReadyMemberIsDropped(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	b.rdb.ZAdd(ctx, b.k.Ready, redisZ("ghost", 1))
	b.enqueue(t, Task{ID: "real"})
	cl := b.claim(t, 10, time.Minute)
	if got := ids(cl.Tasks); !slices.Equal(got, []string{"real"}) {
		t.Errorf("claimed %v", got)
	}
	if n := b.rdb.ZCard(ctx, b.k.Ready).Val(); n != 0 {
		t.Errorf("ready left %d", n)
	}
}

// A hash whose ZSET member was lost is repaired by a duplicate enqueue (reconcile
// sends one): a ready task gets its member back, an active one an expired lease.
func TestDuplicateEnqueueRepairsLostMember(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	b.enqueue(t, Task{ID: "r"}, Task{ID: "a", RunAt: time.Unix(1, 0)})
	b.claim(t, 1, time.Hour) // "a" becomes active
	b.rdb.ZRem(ctx, b.k.Ready, "r")
	b.rdb.ZRem(ctx, b.k.Active, "a")
	if st := b.enqueue(t, Task{ID: "r"}, Task{ID: "a"}); !slices.Equal(st, []EnqueueStatus{Duplicate, Duplicate}) {
		t.Fatalf("statuses %v", st)
	}
	if r, err := b.c.Reap(ctx, "q", 10); err != nil || !slices.Equal(r.Requeued, []string{"a"}) {
		t.Errorf("reap %+v %v", r, err)
	}
	if n := b.rdb.ZCard(ctx, b.k.Ready).Val(); n != 2 {
		t.Errorf("ready %d", n)
	}
}

func TestScriptFlush(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	b.enqueue(t, Task{ID: "before"})
	if err := b.rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, Task{ID: "after"})
	cl := b.claim(t, 10, time.Minute)
	if got := ids(cl.Tasks); !slices.Equal(got, []string{"after", "before"}) {
		t.Fatalf("claimed %v", got)
	}
	if err := b.rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.c.Complete(ctx, "q", cl.Tasks[0].ID, cl.Tasks[0].Token); err != nil {
		t.Fatal(err)
	}
}

func TestContextCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.c.Claim(ctx, "q", 1, time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("Claim: %v", err)
	}
}
