package dispatch

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// The claim script and LatenessBucket put every lateness in the same bucket, and
// each bucket's bounds hold it.
func TestLatenessBucketMatchesScript(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	lib, err := luaFS.ReadFile("lua/lib.lua")
	if err != nil {
		t.Fatal(err)
	}
	src := "local SCRIPT = 'test'\n" + string(lib) +
		"local out = {} for i = 1, #ARGV do out[i] = hist_bucket(tonumber(ARGV[i])) end return out"
	var ms []any
	for _, v := range []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16, 999, 1000, 1023, 1024, 1279, 1280,
		59999, 60000, 3600000, 1 << 29, 1<<29*7/4 - 1, 1 << 29 * 7 / 4, 1 << 30, 1 << 40} {
		ms = append(ms, v)
	}
	for v := int64(17); v < 5000; v += 37 {
		ms = append(ms, v)
	}
	args := make([]any, len(ms))
	for i, v := range ms {
		args[i] = strconv.FormatInt(v.(int64), 10)
	}
	got, err := b.rdb.Eval(ctxT(t), src, nil, args...).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range ms {
		d := time.Duration(v.(int64)) * time.Millisecond
		want := LatenessBucket(d)
		if int(got[i]) != want {
			t.Errorf("%d ms: script bucket %d, Go %d", v, got[i], want)
		}
		lo, hi := BucketBounds(want)
		if d < lo || d >= hi {
			t.Errorf("%d ms in bucket %d: bounds [%v, %v)", v, want, lo, hi)
		}
	}
}

func TestHistogramQuantile(t *testing.T) {
	t.Parallel()
	var h Histogram
	if _, ok := h.Quantile(0.5); ok {
		t.Fatal("empty histogram has a quantile")
	}
	for range 98 {
		h[LatenessBucket(3*time.Millisecond)]++
	}
	h[LatenessBucket(2*time.Second)] += 2
	p50, _ := h.Quantile(0.5)
	p99, _ := h.Quantile(0.99)
	if p50 < 3*time.Millisecond || p50 > 4*time.Millisecond {
		t.Errorf("p50 %v", p50)
	}
	if p99 < 2*time.Second || p99 > 2500*time.Millisecond {
		t.Errorf("p99 %v", p99)
	}
	var m Histogram
	m.Merge(&h)
	m.Merge(&h)
	if m.Count() != 200 {
		t.Errorf("merged count %d", m.Count())
	}
}

// A claim records its tasks' lateness and a completion its count in the hash of
// the minute, kept for the retention; History reads them back. The history is one
// hash per minute whatever the number of tasks.
func TestHistory(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	var tasks []Task
	for i := range 40 {
		late := 2 * time.Second
		if i >= 38 {
			late = time.Minute
		}
		tasks = append(tasks, Task{ID: fmt.Sprintf("t%02d", i), RunAt: now.Add(-late)})
	}
	b.enqueue(t, tasks...)
	cl := b.claim(t, 40, time.Minute)
	if len(cl.Tasks) != 40 {
		t.Fatalf("claimed %d", len(cl.Tasks))
	}
	var leases []Lease
	for _, ct := range cl.Tasks[:30] {
		leases = append(leases, Lease{ID: ct.ID, Token: ct.Token})
	}
	if _, err := b.c.CompleteMany(ctx, "q", leases); err != nil {
		t.Fatal(err)
	}
	keys, err := b.rdb.Keys(ctx, b.k.History+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) < 1 || len(keys) > 2 { // the claim and the completion may straddle a minute
		t.Fatalf("history keys %v", keys)
	}
	for _, k := range keys {
		ttl := b.rdb.PTTL(ctx, k).Val()
		if ttl <= HistoryRetention-time.Minute || ttl > HistoryRetention {
			t.Errorf("%s: TTL %v", k, ttl)
		}
	}
	hist, err := b.c.History(ctx, time.Now().Add(time.Second), 60, "q", "other")
	if err != nil {
		t.Fatal(err)
	}
	ms := hist["q"]
	if len(ms) != 60 || len(hist["other"]) != 60 {
		t.Fatalf("%d minutes", len(ms))
	}
	var all Histogram
	var done int64
	for i, m := range ms {
		all.Merge(&m.Lateness)
		done += m.Done
		if i > 0 && m.Start.Sub(ms[i-1].Start) != time.Minute {
			t.Fatalf("minute %d starts %v after %v", i, m.Start, ms[i-1].Start)
		}
	}
	if all.Count() != 40 || done != 30 {
		t.Fatalf("claims %d, done %d", all.Count(), done)
	}
	p50, _ := all.Quantile(0.5)
	p99, _ := all.Quantile(0.99)
	if p50 < 2*time.Second || p50 > 2600*time.Millisecond || p99 < time.Minute || p99 > 76*time.Second {
		t.Errorf("p50 %v, p99 %v", p50, p99)
	}
	if _, err := b.c.History(ctx, time.Now(), 0, "q"); err == nil {
		t.Error("0 minutes accepted")
	}
	if _, err := b.c.History(ctx, time.Now(), 60, "bad{queue"); err == nil {
		t.Error("bad queue accepted")
	}
}

// Paused time is no worker's lateness: a task that fell due while its queue was
// paused is late from the resume, one due after it from its due time.
func TestLatenessExcludesPausedTime(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	if _, err := b.c.SetControls(ctx, "q", 1, Controls{Paused: true}); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, Task{ID: "due-an-hour-ago", RunAt: now.Add(-time.Hour)})
	if cl := b.claim(t, 10, time.Minute); len(cl.Tasks) != 0 {
		t.Fatalf("claimed %d from a paused queue", len(cl.Tasks))
	}
	if _, err := b.c.SetControls(ctx, "q", 2, Controls{}); err != nil {
		t.Fatal(err)
	}
	// A resume that is not one (paused already false) keeps the resume time.
	if _, err := b.c.SetControls(ctx, "q", 3, Controls{}); err != nil {
		t.Fatal(err)
	}
	cl := b.claim(t, 10, time.Minute)
	if len(cl.Tasks) != 1 {
		t.Fatalf("claimed %d after the resume", len(cl.Tasks))
	}
	// The claimed task carries the resume, for the worker's lateness metric.
	if r := cl.Tasks[0].Resumed; !r.After(cl.Tasks[0].Due) || cl.Now.Sub(r) > 5*time.Second {
		t.Errorf("Resumed = %v, want the resume (due %v, claimed %v)", r, cl.Tasks[0].Due, cl.Now)
	}
	// A task due after the resume is late from its due time.
	b.enqueue(t, Task{ID: "due-now", RunAt: redisNow(t, b.rdb)})
	if cl := b.claim(t, 10, time.Minute); len(cl.Tasks) != 1 || !cl.Tasks[0].Resumed.IsZero() {
		t.Errorf("a task due after the resume: %+v", cl.Tasks)
	}
	hist, err := b.c.History(ctx, time.Now().Add(time.Second), 5, "q")
	if err != nil {
		t.Fatal(err)
	}
	var all Histogram
	for i := range hist["q"] {
		all.Merge(&hist["q"][i].Lateness)
	}
	if p, ok := all.Quantile(1); !ok || p > 5*time.Second {
		t.Errorf("lateness of a task due an hour before the resume: %v (%v), want from the resume", p, ok)
	}
}
