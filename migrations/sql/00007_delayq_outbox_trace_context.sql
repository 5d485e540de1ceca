-- The trace context of a task's enqueue (a W3C traceparent and tracestate, written
-- by package delayqotel through outbox.Config.TraceContext), moved by the relay into
-- the task hash and handed to the worker, so that enqueue, relay, claim and handler
-- are one trace. NULL for tasks enqueued without one: a nullable column without a
-- default is a catalog change only, no table rewrite.

-- +goose Up
ALTER TABLE {{schema}}.delayq_outbox ADD COLUMN IF NOT EXISTS trace_context text;

-- +goose Down
ALTER TABLE {{schema}}.delayq_outbox DROP COLUMN IF EXISTS trace_context;
