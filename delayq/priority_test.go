package delayq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/outbox"
)

func TestPriorityGroupValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, err := newWorker(b.pool, b.dq, b.ob, WorkerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	nop := func(context.Context, *Task) error { return nil }
	for _, q := range []string{"a", "b"} {
		if err := w.Handle(q, nop, QueueConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		g    PriorityGroup
		want error
	}{
		{PriorityGroup{}, ErrInvalidConfig},
		{PriorityGroup{Queues: map[string]int{"a": 0}}, ErrInvalidConfig},
		{PriorityGroup{Queues: map[string]int{"a": 1001}}, ErrInvalidConfig},
		{PriorityGroup{Queues: map[string]int{"a": 1}, Concurrency: -1}, ErrInvalidConfig},
		{PriorityGroup{Queues: map[string]int{"a": 1}, Concurrency: 1001}, ErrInvalidConfig},
		{PriorityGroup{Queues: map[string]int{"a": 1, "nohandler": 1}}, ErrInvalidQueue},
	} {
		if err := w.Prioritize(tc.g); !errors.Is(err, tc.want) {
			t.Errorf("Prioritize(%+v): %v, want %v", tc.g, err, tc.want)
		}
	}
	if err := w.Prioritize(PriorityGroup{Queues: map[string]int{"a": 2, "b": 1}}); err != nil {
		t.Fatal(err)
	}
	if err := w.Prioritize(PriorityGroup{Queues: map[string]int{"b": 1}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("a queue in two groups: %v", err)
	}
	if g := (PriorityGroup{Queues: map[string]int{"a": 1}}).WithDefaults(); g.Concurrency != 10 || g.Strict {
		t.Errorf("defaults: %+v", g)
	}
}

// startLog records the order in which handlers of several queues start.
type startLog struct {
	mu     sync.Mutex
	queues []string
}

func (l *startLog) handler(t *testing.T) txHandler {
	return func(ctx context.Context, tx pgx.Tx, tk *Task) error {
		l.mu.Lock()
		l.queues = append(l.queues, tk.Queue)
		l.mu.Unlock()
		return insertEffect(ctx, tx, tk, "w")
	}
}

func (l *startLog) order() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.queues...)
}

// runGroup enqueues n tasks into each queue of counts, runs one worker with the
// queues in group g (one slot, so that every start is the group's decision) until
// every task finished, and returns the queues of the starts in order. Each task
// ran once, with one effect.
func runGroup(t *testing.T, g PriorityGroup, counts map[string]int) []string {
	b := setup(t)
	var tasks []outbox.Task
	total := 0
	for _, q := range sortedNames(counts) {
		for _, id := range ids(q, counts[q]) {
			tasks = append(tasks, task(q, id))
		}
		total += counts[q]
	}
	b.enqueue(t, tasks...) // all due before the worker starts: a backlog in each
	log := &startLog{}
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		for q := range counts {
			if err := w.HandleTx(q, log.handler(t), QueueConfig{}); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Prioritize(g); err != nil {
			t.Fatal(err)
		}
	})
	for range total {
		if f := h.next(t); f.out != outSucceeded {
			t.Fatalf("%s/%s: %s", f.task.Queue, f.task.ID, f.out)
		}
	}
	h.stop()
	if got := b.count(t, `SELECT count(DISTINCT task_id) FROM effects`); got != total {
		t.Errorf("%d tasks with effects, want %d", got, total)
	}
	if got := b.count(t, `SELECT count(*) FROM effects`); got != total {
		t.Errorf("%d effects, want %d", got, total)
	}
	if got := b.count(t, `SELECT count(*) FROM delayq_outbox WHERE state = 'done'`); got != total {
		t.Errorf("%d rows done, want %d", got, total)
	}
	return log.order()
}

func share(order []string) map[string]int {
	m := map[string]int{}
	for _, q := range order {
		m[q]++
	}
	return m
}

// Weights 6:3:1 with a backlog in every queue: every 10 starts, 6, 3 and 1. When
// the heavy queue runs dry, the others take its turns.
func TestPriorityGroupWeighted(t *testing.T) {
	t.Parallel()
	order := runGroup(t, PriorityGroup{Queues: map[string]int{"hi": 6, "mid": 3, "lo": 1}, Concurrency: 1},
		map[string]int{"hi": 120, "mid": 100, "lo": 40})
	got := share(order[:200])
	if got["hi"] != 120 || got["mid"] != 60 || got["lo"] != 20 {
		t.Errorf("first 200 starts: %v; want hi 120, mid 60, lo 20", got)
	}
	for i := 0; i+10 <= 200; i += 10 {
		if s := share(order[i : i+10]); s["hi"] != 6 || s["mid"] != 3 || s["lo"] != 1 {
			t.Errorf("starts %d..%d: %v, want 6:3:1", i, i+9, s)
		}
	}
	// hi is done after 200 starts: mid and lo share 3:1 until mid is.
	if got := share(order[200:240]); got["mid"] != 30 || got["lo"] != 10 {
		t.Errorf("starts 200..239: %v; want mid 30, lo 10", got)
	}
}

// A queue of weight 1 beside a large backlog of weight 9: its tasks start one in
// ten, long before the backlog is done.
func TestPriorityGroupLowWeightNotStarved(t *testing.T) {
	t.Parallel()
	order := runGroup(t, PriorityGroup{Queues: map[string]int{"bulk": 9, "rare": 1}, Concurrency: 1},
		map[string]int{"bulk": 300, "rare": 5})
	last := -1
	for i, q := range order {
		if q == "rare" {
			last = i
		}
	}
	if last < 0 || last >= 60 {
		t.Errorf("the last of 5 rare tasks started at %d of %d; want within the first 60 (one in ten)", last, len(order))
	}
}

// Strict: the lower queue starts only once the higher has nothing due.
func TestPriorityGroupStrict(t *testing.T) {
	t.Parallel()
	order := runGroup(t, PriorityGroup{Queues: map[string]int{"hi": 5, "mid": 2, "lo": 1}, Strict: true, Concurrency: 1},
		map[string]int{"hi": 40, "mid": 30, "lo": 20})
	want := make([]string, 0, 90)
	for _, q := range []struct {
		name string
		n    int
	}{{"hi", 40}, {"mid", 30}, {"lo", 20}} {
		for range q.n {
			want = append(want, q.name)
		}
	}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("strict order:\n%v\nwant\n%v", order, want)
	}
}

// An idle group sleeps on its queues' wake-ups (not MaxWait): a task enqueued into
// any of them, and a second slot's worth in another, run at once. Each queue's own
// Concurrency caps its share of the group's slots.
func TestPriorityGroupWakesAndCaps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dq, err := dispatch.New(b.rdb, dispatch.Config{Prefix: b.prefix, MaxWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	b.dq = dq
	release := make(chan struct{})
	var mu sync.Mutex
	running := map[string]int{}
	peak := map[string]int{}
	claims := &claimCounter{}
	h := b.start(t, WorkerConfig{Observer: claims}, func(w *worker) {
		for _, q := range []string{"a", "b"} {
			if err := w.HandleTx(q, func(ctx context.Context, tx pgx.Tx, tk *Task) error {
				mu.Lock()
				running[tk.Queue]++
				peak[tk.Queue] = max(peak[tk.Queue], running[tk.Queue])
				mu.Unlock()
				<-release
				mu.Lock()
				running[tk.Queue]--
				mu.Unlock()
				return insertEffect(ctx, tx, tk, "w")
			}, QueueConfig{Concurrency: 2}); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Prioritize(PriorityGroup{Queues: map[string]int{"a": 3, "b": 1}, Concurrency: 3}); err != nil {
			t.Fatal(err)
		}
	})
	// Let the group claim, find nothing and sleep.
	ctx := ctxT(t, 2*time.Minute)
	pollUntil(t, ctx, "an empty claim of each queue", func() bool { return claims.n.Load() >= 2 })
	b.enqueue(t, task("a", "a1"), task("a", "a2"), task("a", "a3"), task("b", "b1"))
	pollUntil(t, ctx, "three runs", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return running["a"]+running["b"] == 3
	})
	close(release)
	for range 4 {
		if f := h.next(t); f.out != outSucceeded {
			t.Fatalf("%s: %s", f.task.ID, f.out)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if peak["a"] != 2 {
		t.Errorf("queue a ran %d at once; want its Concurrency, 2", peak["a"])
	}
	if got := b.count(t, `SELECT count(*) FROM effects`); got != 4 {
		t.Errorf("%d effects, want 4", got)
	}
}

// claimCounter is an Observer that counts claims.
type claimCounter struct{ n atomic.Int64 }

func (c *claimCounter) Claim(context.Context, ClaimEvent)                     { c.n.Add(1) }
func (c *claimCounter) RunStart(ctx context.Context, _ *Task) context.Context { return ctx }
func (c *claimCounter) RunEnd(context.Context, *Task, RunEndEvent)            {}

func pollUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("not in time: %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
