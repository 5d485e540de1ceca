package dispatch

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"
)

func TestProbe(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.enqueue(t,
		Task{ID: "r", Payload: []byte("p"), RunAt: now.Add(time.Hour), MaxAttempts: 3, Version: 2},
		Task{ID: "a", RunAt: now.Add(-time.Second)},
	)
	cl := b.claim(t, 10, time.Minute)
	if len(cl.Tasks) != 1 {
		t.Fatalf("claimed %d", len(cl.Tasks))
	}
	// A hash without its member, and a member without a hash.
	if err := b.rdb.ZAdd(ctx, b.k.Ready, redisZ("ghost", 1)).Err(); err != nil {
		t.Fatal(err)
	}
	pnow, ps, err := b.c.Probe(ctx, b.queue, "r", "a", "ghost", "none")
	if err != nil {
		t.Fatal(err)
	}
	if d := pnow.Sub(now); d < 0 || d > 10*time.Second {
		t.Errorf("probe now %v, Redis now %v", pnow, now)
	}
	r, a, g, n := ps[0], ps[1], ps[2], ps[3]
	if r.State != StateReady || !r.InReady || r.InActive || r.InDead || r.Version != 2 || r.MaxAttempts != 3 ||
		!r.ReadyScore.Equal(ceilMilli(now.Add(time.Hour))) || !r.Consistent() {
		t.Errorf("ready probe %+v", r)
	}
	if a.State != StateActive || !a.InActive || a.Attempt != 1 || a.ActiveScore.Before(now) || !a.Consistent() {
		t.Errorf("active probe %+v", a)
	}
	if g.State != StateMissing || !g.InReady || g.Consistent() {
		t.Errorf("ghost probe %+v", g)
	}
	if n.State != StateMissing || n.InReady || n.InActive || n.InDead || !n.Consistent() {
		t.Errorf("missing probe %+v", n)
	}
	if r.Fingerprint == a.Fingerprint || g.Fingerprint == n.Fingerprint {
		t.Errorf("fingerprints not distinct: %q %q %q %q", r.Fingerprint, a.Fingerprint, g.Fingerprint, n.Fingerprint)
	}
	if _, _, err := b.c.Probe(ctx, b.queue); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Probe of no ids: %v", err)
	}
	if _, _, err := b.c.Probe(ctx, b.queue, "a{b"); !errors.Is(err, ErrInvalidTaskID) {
		t.Errorf("Probe of a bad id: %v", err)
	}
}

func TestRepairIf(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.enqueue(t, Task{ID: "x", RunAt: now.Add(time.Hour)}, Task{ID: "y", RunAt: now.Add(time.Hour)})
	_, ps, err := b.c.Probe(ctx, b.queue, "x", "y", "z")
	if err != nil {
		t.Fatal(err)
	}
	// y changes after the probe: its repair must not apply.
	if err := b.rdb.HSet(ctx, b.k.TaskKey("y"), "a", 5).Err(); err != nil {
		t.Fatal(err)
	}
	restore := Task{Payload: []byte("new"), RunAt: now.Add(-time.Second), MaxAttempts: 4, Attempt: 2, Version: 3}
	got, err := b.c.RepairIf(ctx, b.queue,
		Repair{Op: RepairRestore, ID: "x", Fingerprint: ps[0].Fingerprint, Task: restore},
		Repair{Op: RepairRemove, ID: "y", Fingerprint: ps[1].Fingerprint},
		Repair{Op: RepairRestore, ID: "z", Fingerprint: ps[2].Fingerprint, Task: restore},
	)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []bool{true, false, true}) {
		t.Fatalf("applied %v, want [true false true]", got)
	}
	cl := b.claim(t, 10, time.Minute)
	if len(cl.Tasks) != 2 {
		t.Fatalf("claimed %+v", cl.Tasks)
	}
	for _, ct := range cl.Tasks {
		if string(ct.Payload) != "new" || ct.Attempt != 3 || ct.MaxAttempts != 4 || ct.Version != 3 {
			t.Errorf("restored task %+v", ct)
		}
	}
	if info := b.info(t, "y"); info.State != StateReady || info.Attempt != 5 {
		t.Errorf("y was changed: %+v", info)
	}

	// Expire: an active task that lost its active member goes back there, expired.
	if err := b.rdb.ZRem(ctx, b.k.Active, "x").Err(); err != nil {
		t.Fatal(err)
	}
	_, ps, err = b.c.Probe(ctx, b.queue, "x", "y")
	if err != nil {
		t.Fatal(err)
	}
	got, err = b.c.RepairIf(ctx, b.queue,
		Repair{Op: RepairExpire, ID: "x", Fingerprint: ps[0].Fingerprint},
		Repair{Op: RepairExpire, ID: "y", Fingerprint: ps[1].Fingerprint}) // y is not active: refused
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []bool{true, false}) {
		t.Fatalf("expire applied %v", got)
	}
	rr, err := b.c.Reap(ctx, b.queue, 10)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rr.Requeued, []string{"x"}) {
		t.Errorf("reaped %+v, want x requeued", rr)
	}

	// Remove with a fresh fingerprint.
	_, ps, err = b.c.Probe(ctx, b.queue, "y")
	if err != nil {
		t.Fatal(err)
	}
	if got, err = b.c.RepairIf(ctx, b.queue, Repair{Op: RepairRemove, ID: "y", Fingerprint: ps[0].Fingerprint}); err != nil || !got[0] {
		t.Fatalf("remove: %v %v", got, err)
	}
	if n, _ := b.rdb.Exists(ctx, b.k.TaskKey("y")).Result(); n != 0 {
		t.Error("y hash still exists")
	}

	// Invalid repairs write nothing.
	before := b.snapshot(t)
	for _, r := range []Repair{
		{Op: 0, ID: "x"},
		{Op: RepairRestore, ID: "x", Task: Task{Attempt: -1}},
		{Op: RepairRemove, ID: ""},
	} {
		if _, err := b.c.RepairIf(ctx, b.queue, Repair{Op: RepairRemove, ID: "x"}, r); err == nil {
			t.Errorf("RepairIf(%+v): no error", r)
		}
	}
	sameSnapshot(t, "invalid repairs", before, b.snapshot(t))
}

func TestScanIDsAndQueues(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	var want []string
	var tasks []Task
	for i := range 300 {
		id := fmt.Sprintf("id-%03d", i)
		want = append(want, id)
		tasks = append(tasks, Task{ID: id, RunAt: now.Add(time.Duration(i-100) * time.Second)})
	}
	b.enqueue(t, tasks...)
	b.claim(t, 50, time.Minute)
	// A hash in no ZSET, and another queue that must not show up.
	if err := b.rdb.HSet(ctx, b.k.TaskKey("lonely"), "s", "r").Err(); err != nil {
		t.Fatal(err)
	}
	want = append(want, "lonely")
	if _, err := b.c.Enqueue(ctx, "other", Task{ID: "id-x"}); err != nil {
		t.Fatal(err)
	}
	scan := func(cur ScanCursor) []string {
		seen := map[string]bool{}
		for calls := 0; !cur.Done(); calls++ {
			if calls > 1000 {
				t.Fatal("scan does not end")
			}
			ids, next, err := b.c.ScanIDs(ctx, b.queue, cur, 100)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				seen[id] = true
			}
			cur = next
		}
		var got []string
		for id := range seen {
			got = append(got, id)
		}
		sort.Strings(got)
		return got
	}
	sort.Strings(want)
	// The deep walk finds the lonely hash too; the default walks the ZSETs alone.
	if got := scan(DeepScanCursor()); !slices.Equal(got, want) {
		t.Errorf("deep scan: %d ids, want %d (first %v)", len(got), len(want), got[:min(5, len(got))])
	}
	inZSETs := slices.DeleteFunc(slices.Clone(want), func(id string) bool { return id == "lonely" })
	if got := scan(ScanCursor{}); !slices.Equal(got, inZSETs) {
		t.Errorf("scan of the ZSETs: %d ids, want %d (first %v)", len(got), len(inZSETs), got[:min(5, len(got))])
	}
	qs, err := b.c.Queues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(qs, []string{"other", "q"}) {
		t.Errorf("Queues = %v", qs)
	}
}
