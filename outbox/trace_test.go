package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

type traceKey struct{}

// The trace context is stored with the task: Task.TraceContext, else what
// Config.TraceContext returns for the enqueue's context (an invalid one dropped,
// never an error), else NULL; an invalid Task.TraceContext is refused.
func TestTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	c, err := outbox.New(outbox.Config{TraceContext: func(ctx context.Context) string {
		s, _ := ctx.Value(traceKey{}).(string)
		return s
	}})
	if err != nil {
		t.Fatal(err)
	}
	tctx := context.WithValue(ctx, traceKey{}, "from-ctx")
	bad := context.WithValue(ctx, traceKey{}, strings.Repeat("x", 513))
	for _, e := range []struct {
		ctx context.Context
		t   outbox.Task
	}{
		{tctx, outbox.Task{Queue: "tr", ID: "hook"}},
		{tctx, outbox.Task{Queue: "tr", ID: "own", TraceContext: "own"}},
		{ctx, outbox.Task{Queue: "tr", ID: "none"}},
		{bad, outbox.Task{Queue: "tr", ID: "dropped"}},
	} {
		if _, err := c.Enqueue(e.ctx, b.pool, e.t); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.EnqueueMany(tctx, b.pool, []outbox.Task{
		{Queue: "tr", ID: "m1"}, {Queue: "tr", ID: "m2", TraceContext: "own2"},
	}); err != nil {
		t.Fatal(err)
	}
	plain, _ := outbox.New(outbox.Config{})
	if _, err := plain.EnqueueMany(ctx, b.pool, []outbox.Task{{Queue: "tr", ID: "m3"}, {Queue: "tr", ID: "m4"}}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"hook": "from-ctx", "own": "own", "none": "NULL", "dropped": "NULL",
		"m1": "from-ctx", "m2": "own2", "m3": "NULL", "m4": "NULL"}
	rows, err := b.pool.Query(ctx, `SELECT task_id, coalesce(trace_context, 'NULL') FROM delayq_outbox WHERE queue = 'tr'`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var id, tc string
		if err := rows.Scan(&id, &tc); err != nil {
			t.Fatal(err)
		}
		got[id] = tc
	}
	if rows.Err() != nil || len(got) != len(want) {
		t.Fatalf("rows %v (%v), want %v", got, rows.Err(), want)
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: trace_context %q, want %q", id, got[id], w)
		}
	}
	for _, tc := range []string{strings.Repeat("x", 513), "a\nb"} {
		_, err := c.Enqueue(ctx, b.pool, outbox.Task{Queue: "tr", ID: "bad", TraceContext: tc})
		if !errors.Is(err, validate.ErrInvalidTraceContext) {
			t.Errorf("TraceContext %q: %v, want ErrInvalidTraceContext", tc, err)
		}
	}
}
