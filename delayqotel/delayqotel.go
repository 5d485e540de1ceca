// Package delayqotel traces delayq with OpenTelemetry: the trace context current at
// enqueue is stored with the task (outbox row, Redis task hash, claim), and the
// relay's move and the worker's run continue it, so that enqueue → relay → claim →
// handler → completion is one trace.
//
// Wire it in three places:
//
//	ob, _ := outbox.New(outbox.Config{TraceContext: delayqotel.TraceContext})
//	rl, _ := relay.New(pool, dq.AsRedis(), relay.Config{Observer: delayqotel.NewRelayObserver(nil)})
//	w, _ := worker.New(pool, dq, ob, worker.Config{Observer: delayqotel.NewWorkerObserver(nil)})
//
// The worker's span ("delayq.run <queue>", kind consumer) is the parent of whatever
// the handler traces with its context, and ends after the run's bookkeeping (the
// commit with the completion, the ack) with the outcome. The relay's span
// ("delayq.relay <queue>") covers the round that moved the task. Both are children
// of the enqueue's span. The core packages do not import OpenTelemetry: this one
// does.
package delayqotel

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/relay"
)

// ScopeName is the instrumentation scope of the spans.
const ScopeName = "github.com/delayq/delayq/delayqotel"

// TraceContext returns the W3C trace context of ctx's span as delayq stores it with
// a task ("traceparent" or "traceparent tracestate": a traceparent holds no space),
// or "" when ctx has no valid span. Give it to outbox.Config.TraceContext.
func TraceContext(ctx context.Context) string {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	tp := c["traceparent"]
	if tp == "" {
		return ""
	}
	if ts := c["tracestate"]; ts != "" {
		return tp + " " + ts
	}
	return tp
}

// Extract returns ctx with the remote span context of a stored trace context (as
// TraceContext writes it); ctx unchanged when s holds none.
func Extract(ctx context.Context, s string) context.Context {
	if s == "" {
		return ctx
	}
	tp, ts, _ := strings.Cut(s, " ")
	c := propagation.MapCarrier{"traceparent": tp}
	if ts != "" {
		c["tracestate"] = ts
	}
	return propagation.TraceContext{}.Extract(ctx, c)
}

// Options configure the observers. The zero value means every default.
type Options struct {
	// TracerProvider makes the tracer. Default: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

func (o *Options) tracer() trace.Tracer {
	tp := otel.GetTracerProvider()
	if o != nil && o.TracerProvider != nil {
		tp = o.TracerProvider
	}
	return tp.Tracer(ScopeName)
}

func taskAttrs(queue, id string) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("messaging.system", "delayq"),
		attribute.String("messaging.destination.name", queue),
		attribute.String("messaging.message.id", id),
	}
}

// WorkerObserver is a worker.Observer that runs each task in a span continuing its
// enqueue's trace.
type WorkerObserver struct {
	tracer trace.Tracer
}

// NewWorkerObserver returns a WorkerObserver; opts may be nil.
func NewWorkerObserver(opts *Options) *WorkerObserver {
	return &WorkerObserver{tracer: opts.tracer()}
}

// Claim does nothing: a claim belongs to no one task's trace.
func (o *WorkerObserver) Claim(context.Context, delayq.ClaimEvent) {}

// RunStart starts the run's span, a child of the enqueue's span when the task has
// a trace context (else a root).
func (o *WorkerObserver) RunStart(ctx context.Context, t *delayq.Task) context.Context {
	attrs := append(taskAttrs(t.Queue, t.ID),
		attribute.Int("delayq.attempt", t.Attempt),
		attribute.Int("delayq.version", t.Version),
		attribute.Int64("delayq.claim_lateness_ms", lateness(t).Milliseconds()))
	ctx, _ = o.tracer.Start(Extract(ctx, t.TraceContext), "delayq.run "+t.Queue,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	return ctx
}

// RunEnd ends the run's span with its outcome: an error status for a failed run
// (retried or dead), unset otherwise.
func (o *WorkerObserver) RunEnd(ctx context.Context, _ *delayq.Task, e delayq.RunEndEvent) {
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(attribute.String("delayq.outcome", string(e.Outcome)),
		attribute.Bool("delayq.lease_lost", e.LeaseLost))
	if e.Err != nil {
		span.RecordError(e.Err)
		span.SetStatus(codes.Error, string(e.Outcome))
	}
	span.End()
}

// RelayObserver is a relay.Observer that records, for each task with a trace
// context, a span of the round that moved it to Redis.
type RelayObserver struct {
	tracer trace.Tracer
}

// NewRelayObserver returns a RelayObserver; opts may be nil.
func NewRelayObserver(opts *Options) *RelayObserver {
	return &RelayObserver{tracer: opts.tracer()}
}

// Move records a span for each task with a trace context the round moved.
func (o *RelayObserver) Move(ctx context.Context, m relay.MoveEvent) {
	end := m.Start.Add(m.Duration)
	for _, t := range m.Tasks {
		if t.TraceContext == "" {
			continue
		}
		_, span := o.tracer.Start(Extract(ctx, t.TraceContext), "delayq.relay "+t.Queue,
			trace.WithSpanKind(trace.SpanKindInternal), trace.WithTimestamp(m.Start),
			trace.WithAttributes(taskAttrs(t.Queue, t.ID)...))
		span.End(trace.WithTimestamp(end))
	}
}

// lateness is the run's claim lateness: from its due time, or from its queue's
// resume when it fell due while the queue was paused.
func lateness(t *delayq.Task) time.Duration {
	if t.Resumed.After(t.Due) {
		return t.ClaimedAt.Sub(t.Resumed)
	}
	return t.ClaimedAt.Sub(t.Due)
}
