package forecast_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/forecast"
	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/internal/testenv"
)

// bundle is one test's stores and forecaster.
type bundle struct {
	pool *pgxpool.Pool
	dq   *dispatch.Client
	f    *forecast.Forecaster
}

func setup(t testing.TB, cfg forecast.Config) *bundle {
	t.Helper()
	pool := testenv.Postgres(t)
	rdb, prefix := testenv.Redis(t)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	f, err := forecast.New(pool, dq, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{pool: pool, dq: dq, f: f}
}

// row inserts an outbox row of queue in state, due at runAt.
func (b *bundle) row(t testing.TB, queue, state string, runAt time.Time, n int) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, queued_at, done_at)
SELECT $1, $2 || '-' || i, $3, 'x', 1, $4,
       CASE WHEN $4 = 'pending' THEN NULL ELSE now() END,
       CASE WHEN $4 IN ('pending', 'queued') THEN NULL ELSE now() END
FROM generate_series(1, $5::int) AS i`, queue, fmt.Sprintf("%s-%d", state, runAt.UnixNano()), runAt, state, n)
	if err != nil {
		t.Fatal(err)
	}
}

// The curve: rows at known due times around the forecast's start give the
// expected count in each minute, and the expected recommendation. Edges: a
// queue with nothing (empty), every row overdue, rows beyond the hour, finished
// rows, minute boundaries to the microsecond, a paused queue.
func TestCurve(t *testing.T) {
	t.Parallel()
	b := setup(t, forecast.Config{})
	ctx := context.Background()
	at := time.Now().Truncate(time.Second)
	min := func(m float64) time.Time { return at.Add(time.Duration(m * float64(time.Minute))) }
	us := time.Microsecond

	// spread: each minute boundary, pending and queued alike.
	b.row(t, "spread", "pending", at, 1)                         // minute 0: exactly the start
	b.row(t, "spread", "queued", min(1).Add(-us), 2)             // minute 0: its last microsecond
	b.row(t, "spread", "pending", min(1), 3)                     // minute 1
	b.row(t, "spread", "queued", min(5.5), 4)                    // minute 5
	b.row(t, "spread", "queued", min(60).Add(-us), 5)            // minute 59
	b.row(t, "spread", "pending", min(60), 6)                    // the hour's end: out
	b.row(t, "spread", "queued", min(120), 7)                    // beyond: out
	b.row(t, "spread", "done", min(2), 8)                        // finished: out
	b.row(t, "spread", "dead", min(2), 9)                        // out
	b.row(t, "spread", "cancelled", min(2), 10)                  // out
	b.row(t, "overdue", "pending", at.Add(-us), 11)              // the relay's lag
	b.row(t, "overdue", "pending", at.Add(-time.Hour), 12)       // the relay's lag
	b.row(t, "overdue", "queued", at.Add(-time.Millisecond), 13) // Redis's backlog: not from here
	b.row(t, "beyond", "pending", min(61), 14)
	b.row(t, "beyond", "queued", min(24*60), 15)
	b.row(t, "peak", "queued", min(10.5), 600)
	b.row(t, "peak", "queued", min(11), 1)
	b.row(t, "paused", "queued", min(0.5), 120)
	ctl, err := queuectl.New(b.pool, b.dq, "public")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.Pause(ctx, "paused"); err != nil {
		t.Fatal(err)
	}

	if err := b.f.RefreshAt(ctx, at); err != nil {
		t.Fatal(err)
	}
	s, ok := b.f.Last()
	if !ok || !s.At.Equal(at) {
		t.Fatalf("snapshot at %v (%v), want %v", s.At, ok, at)
	}
	curve := func(m map[int]int64) (c [forecast.Minutes]int64) {
		for i, n := range m {
			c[i] = n
		}
		return c
	}
	def := forecast.Params{}.WithDefaults() // 5m lead, 1s, 10 a worker
	for _, tc := range []struct {
		queue   string
		present bool
		due     [forecast.Minutes]int64
		overdue int64
		paused  bool
		params  forecast.Params
		workers int64
	}{
		{"empty", false, curve(nil), 0, false, def, 0},
		{"spread", true, curve(map[int]int64{0: 3, 1: 3, 5: 4, 59: 5}), 0, false, def, 1},
		{"overdue", true, curve(nil), 23, false, def, 1},
		{"beyond", false, curve(nil), 0, false, def, 0},
		// 600 tasks in minute 10 at 1 s each: 10 busy slots, a worker of 10.
		{"peak", true, curve(map[int]int64{10: 600, 11: 1}), 0, false, def, 0},
		{"peak", true, curve(map[int]int64{10: 600, 11: 1}), 0, false, forecast.Params{Lead: 11 * time.Minute}.WithDefaults(), 1},
		{"peak", true, curve(map[int]int64{10: 600, 11: 1}), 0, false, forecast.Params{Lead: 10*time.Minute + time.Second}.WithDefaults(), 1},
		{"peak", true, curve(map[int]int64{10: 600, 11: 1}), 0, false, forecast.Params{Lead: 15 * time.Minute, Handling: 2 * time.Second}.WithDefaults(), 2},
		{"peak", true, curve(map[int]int64{10: 600, 11: 1}), 0, false, forecast.Params{Lead: time.Hour, Handling: 1500 * time.Millisecond, Concurrency: 4}.WithDefaults(), 4},
		{"paused", true, curve(map[int]int64{0: 120}), 0, true, def, 0},
	} {
		q, ok := s.Queue(tc.queue)
		if ok != tc.present || q.Name != tc.queue || q.Due != tc.due || q.OverduePending != tc.overdue || q.Paused != tc.paused {
			t.Errorf("%s: present %v, due %v, overdue %d, paused %v; want %v, %v, %d, %v",
				tc.queue, ok, q.Due, q.OverduePending, q.Paused, tc.present, tc.due, tc.overdue, tc.paused)
		}
		if err := tc.params.Validate(); err != nil {
			t.Fatal(err)
		}
		if w := tc.params.Workers(&q); w != tc.workers {
			t.Errorf("%s with %+v: %d workers, want %d", tc.queue, tc.params, w, tc.workers)
		}
	}
	// The paused queue's counts are still there: a resume needs them at once.
	if q, _ := s.Queue("paused"); q.DueWithin(time.Minute) != 120 || q.DueWithin(time.Hour) != 120 {
		t.Errorf("paused: due within 1m %d, 60m %d; want 120", q.DueWithin(time.Minute), q.DueWithin(time.Hour))
	}
	if q, _ := s.Queue("spread"); q.DueWithin(time.Minute) != 3 || q.DueWithin(5*time.Minute) != 6 ||
		q.DueWithin(15*time.Minute) != 10 || q.DueWithin(time.Hour) != 15 {
		t.Errorf("spread: due within 1m %d, 5m %d, 15m %d, 60m %d; want 3, 6, 10, 15", q.DueWithin(time.Minute),
			q.DueWithin(5*time.Minute), q.DueWithin(15*time.Minute), q.DueWithin(time.Hour))
	}
}

// Workers alone: the backlog counts in the first minute, a peak after the lead
// not at all, the result rounds up and never overflows.
func TestWorkers(t *testing.T) {
	t.Parallel()
	def := forecast.Params{}.WithDefaults()
	big := forecast.Queue{Ready: math.MaxInt64}
	for _, tc := range []struct {
		name string
		q    forecast.Queue
		p    forecast.Params
		want int64
	}{
		{"nothing", forecast.Queue{}, def, 0},
		{"one task", forecast.Queue{Due: [forecast.Minutes]int64{1}}, def, 1},
		{"backlog alone", forecast.Queue{Ready: 1200}, def, 2},
		{"backlog and overdue pending", forecast.Queue{Ready: 600, OverduePending: 1}, def, 2},
		{"backlog, paused", forecast.Queue{Ready: 1200, Paused: true}, def, 0},
		{"active runs are not demand", forecast.Queue{Active: 1000}, def, 0},
		{"peak at the lead's last minute", forecast.Queue{Due: func() (d [forecast.Minutes]int64) { d[4] = 6000; return }()}, def, 10},
		{"peak after the lead", forecast.Queue{Due: func() (d [forecast.Minutes]int64) { d[5] = 6000; return }()}, def, 0},
		{"peak in the hour's last minute", forecast.Queue{Due: func() (d [forecast.Minutes]int64) { d[59] = 60; return }()},
			forecast.Params{Lead: time.Hour, Handling: time.Minute, Concurrency: 1}, 60},
		{"exact", forecast.Queue{Due: [forecast.Minutes]int64{600}}, def, 1},
		{"just over", forecast.Queue{Due: [forecast.Minutes]int64{601}}, def, 2},
		{"slow handler", forecast.Queue{Due: [forecast.Minutes]int64{1}}, forecast.Params{Lead: time.Minute, Handling: time.Hour, Concurrency: 1}, 60},
		{"overflow", big, forecast.Params{Lead: time.Minute, Handling: time.Hour, Concurrency: 1}, math.MaxInt64},
	} {
		p := tc.p.WithDefaults()
		if err := p.Validate(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := p.Workers(&tc.q); got != tc.want {
			t.Errorf("%s: %d workers, want %d", tc.name, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []forecast.Config{
		{Interval: time.Millisecond},
		{Timeout: -time.Second},
		{Schema: "Public"},
		{Schema: "x; DROP TABLE y"},
		{Queues: []string{"ok", "not ok"}},
		{Params: forecast.Params{Lead: 30 * time.Second}},
		{Params: forecast.Params{Lead: 61 * time.Minute}},
		{Params: forecast.Params{Handling: -time.Second}},
		{Params: forecast.Params{Handling: 2 * time.Hour}},
		{Params: forecast.Params{Concurrency: -1}},
		{Params: forecast.Params{Concurrency: forecast.MaxConcurrency + 1}},
	} {
		if err := c.Validate(); !errors.Is(err, forecast.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", c, err)
		}
	}
	if err := (forecast.Config{}).Validate(); err != nil {
		t.Errorf("the zero config: %v", err)
	}
	c := forecast.Config{}.WithDefaults()
	if c.Interval != 30*time.Second || c.Timeout != 5*time.Second || c.Schema != "public" ||
		c.Params != (forecast.Params{Lead: 5 * time.Minute, Handling: time.Second, Concurrency: 10}) {
		t.Errorf("defaults %+v", c)
	}
	if _, err := forecast.New(nil, nil, forecast.Config{}); !errors.Is(err, forecast.ErrInvalidConfig) {
		t.Errorf("New without stores: %v", err)
	}
}

// Run refreshes at once and on every tick, and returns when its context ends; a
// statement that outlasts Timeout is cancelled by the server, counted as a
// failed refresh, and the last forecast stays.
func TestRunAndTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, forecast.Config{Interval: time.Second, Timeout: 300 * time.Millisecond})
	b.row(t, "q", "queued", time.Now().Add(2*time.Minute), 3)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.f.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if s, ok := b.f.Last(); ok && len(s.Queues) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no refresh within 10s of Run")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	first, _ := b.f.Last()

	// A lock held on the table makes the count wait past the timeout.
	tx, err := b.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // released at the end
	if _, err := tx.Exec(context.Background(), "LOCK TABLE delayq_outbox IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = b.f.Refresh(context.Background())
	if err == nil || !strings.Contains(err.Error(), "took longer than 300ms") || time.Since(start) > 5*time.Second {
		t.Errorf("refresh behind a lock: %v after %v, want the statement cancelled at 300ms", err, time.Since(start))
	}
	if s, _ := b.f.Last(); !s.At.Equal(first.At) {
		t.Errorf("the failed refresh replaced the snapshot")
	}
}
