package oteltest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqotel"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// One trace from enqueue to completion, on real servers: the producer's span is
// the parent of the relay's span and of the worker's run, which is the parent of
// what the handler traces, and ends after the completion committed. A task
// enqueued without a span runs in a root span and gets no relay span; a failed run
// has an error status.
func TestOneTrace(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background()) //nolint:errcheck
	opts := &delayqotel.Options{TracerProvider: tp}

	url := testenv.PostgresURL(t)
	pool := testenv.Pool(t, url)
	rdb, prefix := testenv.Redis(t)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{TraceContext: delayqotel.TraceContext})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	rl, err := relay.New(pool, dq.AsRedis(), relay.Config{Observer: delayqotel.NewRelayObserver(opts)})
	if err != nil {
		t.Fatal(err)
	}
	w, err := clientkit.NewClient(pool, dq, ob, delayq.WorkerConfig{Observer: delayqotel.NewWorkerObserver(opts)})
	if err != nil {
		t.Fatal(err)
	}
	tracer := tp.Tracer("app")
	err = w.HandleTx("mail", func(ctx context.Context, tx pgx.Tx, tk *delayq.Task) error {
		ctx, span := tracer.Start(ctx, "handler "+tk.ID)
		defer span.End()
		if tk.ID == "bad" {
			return delayq.NoRetry(errors.New("refused"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (id) VALUES ($1)`, tk.ID)
		return err
	}, delayq.QueueConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range []func(context.Context) error{rl.Run, w.Run} {
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- run(rctx) }()
		defer func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}()
	}

	enqueue := func(ctx context.Context, id string) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if _, err := ob.Enqueue(ctx, tx, outbox.Task{Queue: "mail", ID: id}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	actx, app := tracer.Start(ctx, "POST /signup", trace.WithSpanKind(trace.SpanKindServer))
	enqueue(actx, "welcome")
	enqueue(actx, "bad")
	app.End()
	enqueue(ctx, "untraced")

	var (
		byName map[string]tracetest.SpanStub
		relays []tracetest.SpanStub
	)
	deadline := time.Now().Add(time.Minute)
	for {
		byName, relays = map[string]tracetest.SpanStub{}, nil
		runs := 0
		for _, s := range exp.GetSpans() {
			key := s.Name
			if s.Name == "delayq.run mail" || s.Name == "delayq.relay mail" {
				key += " " + attr(s, "messaging.message.id")
			}
			byName[key] = s
			switch s.Name {
			case "delayq.run mail":
				runs++
			case "delayq.relay mail":
				relays = append(relays, s)
			}
		}
		if runs == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runs traced within a minute; spans: %v", runs, names(exp.GetSpans()))
		}
		time.Sleep(10 * time.Millisecond) // polling the exporter for the condition
	}

	root := byName["POST /signup"].SpanContext
	run := byName["delayq.run mail welcome"]
	handler := byName["handler welcome"]
	relayed := byName["delayq.relay mail welcome"]
	for what, s := range map[string]tracetest.SpanStub{"run": run, "relay": relayed, "handler": handler,
		"failed run": byName["delayq.run mail bad"]} {
		if s.SpanContext.TraceID() != root.TraceID() {
			t.Errorf("%s span in trace %s, want the enqueue's %s", what, s.SpanContext.TraceID(), root.TraceID())
		}
	}
	if run.Parent.SpanID() != root.SpanID() || relayed.Parent.SpanID() != root.SpanID() {
		t.Errorf("run's parent %s, relay's %s: want the enqueue's span %s", run.Parent.SpanID(), relayed.Parent.SpanID(), root.SpanID())
	}
	if handler.Parent.SpanID() != run.SpanContext.SpanID() {
		t.Errorf("the handler's span is not a child of the run's")
	}
	if run.SpanKind != trace.SpanKindConsumer || attr(run, "delayq.outcome") != "succeeded" || run.Status.Code == codes.Error {
		t.Errorf("run span %s, outcome %q, status %v", run.SpanKind, attr(run, "delayq.outcome"), run.Status)
	}
	// The run may start before the relay's round ends: the round writes Redis before
	// its commit.
	if run.EndTime.Before(handler.EndTime) || !relayed.StartTime.Before(run.StartTime) {
		t.Errorf("order: relay starts %v, run %v–%v, handler ends %v", relayed.StartTime, run.StartTime, run.EndTime, handler.EndTime)
	}
	if bad := byName["delayq.run mail bad"]; bad.Status.Code != codes.Error || attr(bad, "delayq.outcome") != "dead" {
		t.Errorf("failed run: status %v, outcome %q", bad.Status, attr(bad, "delayq.outcome"))
	}
	untraced := byName["delayq.run mail untraced"]
	if untraced.Parent.IsValid() || untraced.SpanContext.TraceID() == root.TraceID() {
		t.Errorf("a task enqueued without a span runs in a root span of its own: parent %v", untraced.Parent)
	}
	if len(relays) != 2 {
		t.Errorf("%d relay spans, want 2 (the traced tasks only)", len(relays))
	}
}

// The stored form is the W3C traceparent, with the tracestate after a space, and
// reads back into the same span context; no span, no trace context.
func ExampleTraceContext() {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	ts, _ := trace.ParseTraceState("vendor=a")
	ctx := trace.ContextWithSpanContext(context.Background(), sc.WithTraceState(ts))
	s := delayqotel.TraceContext(ctx)
	fmt.Println(s)
	back := trace.SpanContextFromContext(delayqotel.Extract(context.Background(), s))
	fmt.Println(back.TraceID() == sc.TraceID(), back.SpanID() == sc.SpanID(), back.IsRemote())
	fmt.Printf("%q\n", delayqotel.TraceContext(context.Background()))
	// Output:
	// 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 vendor=a
	// true true true
	// ""
}

func attr(s tracetest.SpanStub, key string) string {
	for _, a := range s.Attributes {
		if a.Key == attribute.Key(key) {
			return a.Value.String()
		}
	}
	return ""
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}
