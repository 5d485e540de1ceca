package bench

import (
	"context"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/relayobs"
	"github.com/delayq/delayq/relay"
)

// histogram counts durations in buckets 1 % wide (from 1 µs), so that an hour's
// millions of latencies take a few kilobytes and a percentile is read within 1 %.
type histogram struct {
	counts map[int]int64
	n      int64
	max    time.Duration
}

const histBase = 1.01

func (h *histogram) add(d time.Duration) {
	if h.counts == nil {
		h.counts = map[int]int64{}
	}
	us := max(1, float64(d)/float64(time.Microsecond))
	h.counts[int(math.Log(us)/math.Log(histBase))]++
	h.n++
	h.max = max(h.max, d)
}

func (h *histogram) merge(o *histogram) {
	for b, c := range o.counts {
		if h.counts == nil {
			h.counts = map[int]int64{}
		}
		h.counts[b] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// quantile returns the upper edge of the bucket holding the p-th percentile (the
// maximum for p = 100), 0 when empty.
func (h *histogram) quantile(p float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	if p >= 100 {
		return h.max
	}
	lo, hi := math.MaxInt, math.MinInt
	for b := range h.counts {
		lo, hi = min(lo, b), max(hi, b)
	}
	rank := int64(math.Ceil(float64(h.n) * p / 100))
	var seen int64
	for b := lo; b <= hi; b++ {
		seen += h.counts[b]
		if seen >= rank {
			return min(h.max, time.Duration(math.Pow(histBase, float64(b+1))*float64(time.Microsecond)))
		}
	}
	return h.max
}

// pruneClock tells whether the relay's retention is deleting rows: gen is odd
// while a pass (a run of delete batches up to a short one) is under way, and
// changes at each pass's start and end, so an operation that read the same even
// value at its start and its end did not overlap a pass.
type pruneClock struct{ gen atomic.Int64 }

func (c *pruneClock) now() int64 { return c.gen.Load() }

// overlapped tells whether an operation that read a at its start and b at its end
// overlapped a pass.
func overlapped(a, b int64) bool { return a != b || a%2 == 1 }

// soakWindow gathers one sample interval's latencies and prune passes; soakStats
// swaps it for an empty one at each sample.
type soakWindow struct {
	enqueue, enqueuePruning       histogram // a producer's BEGIN, Enqueue, COMMIT
	completion, completionPruning histogram // the guard and COMMIT batch of a run
	lateness                      histogram
	early                         int64
	enqueued, completed           int64
	pruneBatches                  histogram // one DELETE statement each
	prunePasses                   histogram
	pruneRows                     int64
	prunePassRowsMax              int64
}

// soakStats is what the soak's producers, worker and relay report, concurrently.
type soakStats struct {
	clock pruneClock
	batch int64 // the relay's RetentionBatch: a shorter batch ends a pass

	mu       sync.Mutex
	cur      soakWindow
	all      soakWindow // every window merged, for the run's figures
	passAt   time.Time  // the open pass's first batch
	passRows int64
}

func (s *soakStats) lock(f func(w *soakWindow)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.cur)
}

// swap returns the window that ends now and starts the next.
func (s *soakStats) swap() soakWindow {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.cur
	s.cur = soakWindow{}
	a := &s.all
	a.enqueue.merge(&w.enqueue)
	a.enqueuePruning.merge(&w.enqueuePruning)
	a.completion.merge(&w.completion)
	a.completionPruning.merge(&w.completionPruning)
	a.lateness.merge(&w.lateness)
	a.pruneBatches.merge(&w.pruneBatches)
	a.prunePasses.merge(&w.prunePasses)
	a.early += w.early
	a.enqueued += w.enqueued
	a.completed += w.completed
	a.pruneRows += w.pruneRows
	a.prunePassRowsMax = max(a.prunePassRowsMax, w.prunePassRowsMax)
	return w
}

// enqueued records one producer's transaction, begun when the prune clock read g0.
func (s *soakStats) enqueued(g0 int64, d time.Duration) {
	pruning := overlapped(g0, s.clock.now())
	s.lock(func(w *soakWindow) {
		w.enqueued++
		if pruning {
			w.enqueuePruning.add(d)
		} else {
			w.enqueue.add(d)
		}
	})
}

func (s *soakStats) started(t *delayq.Task) {
	late := time.Since(t.Due)
	s.lock(func(w *soakWindow) {
		if t.ClaimedAt.Before(t.Due) || late < 0 {
			w.early++
		}
		w.lateness.add(late)
	})
}

// The tracers' context keys.
type (
	pruneKey struct{}
	guardKey struct{}
)

// guardTrace follows one batch of the worker's pool: it is the completion when
// one of its statements is COMMIT.
type guardTrace struct {
	start  time.Time
	gen    int64
	commit bool
}

// workerTracer times the worker's completions: the batch of the guard and COMMIT.
type workerTracer struct{ s *soakStats }

func (workerTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (workerTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t workerTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return context.WithValue(ctx, guardKey{}, &guardTrace{start: time.Now(), gen: t.s.clock.now()})
}

func (workerTracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	if g, ok := ctx.Value(guardKey{}).(*guardTrace); ok && data.SQL == "COMMIT" {
		g.commit = true
	}
}

func (t workerTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	g, ok := ctx.Value(guardKey{}).(*guardTrace)
	if !ok || !g.commit || data.Err != nil {
		return
	}
	d := time.Since(g.start)
	pruning := overlapped(g.gen, t.s.clock.now())
	t.s.lock(func(w *soakWindow) {
		w.completed++
		if pruning {
			w.completionPruning.add(d)
		} else {
			w.completion.add(d)
		}
	})
}

// relayTracer times the retention's DELETE statements on the relay's pool, and
// opens a pass at the first of them.
type relayTracer struct{ s *soakStats }

// isPrune tells the retention's statement (taskstate's Prune) from the relay's
// others.
func isPrune(sql string) bool {
	return strings.HasPrefix(sql, "DELETE FROM") && strings.Contains(sql, "ORDER BY done_at")
}

func (t relayTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !isPrune(data.SQL) {
		return ctx
	}
	now := time.Now()
	t.s.mu.Lock()
	if t.s.passAt.IsZero() {
		t.s.passAt = now
		t.s.clock.gen.Add(1)
	}
	t.s.mu.Unlock()
	return context.WithValue(ctx, pruneKey{}, now)
}

func (t relayTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if at, ok := ctx.Value(pruneKey{}).(time.Time); ok {
		d := time.Since(at)
		t.s.lock(func(w *soakWindow) { w.pruneBatches.add(d) })
	}
}

// Move is relay.Observer's; the tracer wants only the retention's batches, which
// Observe gets.
func (relayTracer) Move(context.Context, relay.MoveEvent) {}

// Observe ends a pass at its short batch (the relay calls it after each batch).
func (t relayTracer) Observe(_ context.Context, e relayobs.Event) {
	re, ok := e.(relayobs.RetentionEvent)
	if !ok {
		return
	}
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur.pruneRows += re.Deleted
	s.passRows += re.Deleted
	if re.Deleted < s.batch && !s.passAt.IsZero() {
		s.cur.prunePasses.add(time.Since(s.passAt))
		s.cur.prunePassRowsMax = max(s.cur.prunePassRowsMax, s.passRows)
		s.passAt, s.passRows = time.Time{}, 0
		s.clock.gen.Add(1)
	}
}
