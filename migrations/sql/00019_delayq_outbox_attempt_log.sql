-- The attempt history of a task (issue 32): a JSON array of the runs that did not
-- succeed, each {"attempt", "version", "at", "outcome", "error"[, "stack"]},
-- oldest first. It is written only by the statements that already record a failure,
-- a death or a run's cancellation (RecordFailure, MarkDead, CancelRun), which
-- append and trim it in the same UPDATE: at most 20 entries and 64 KiB of JSON
-- (the newest entry is always kept; its error is cut to 1 KiB and a panic's stack
-- to 8 KiB). A success writes nothing here: it is the row's done state. Kept on the
-- row, the history is deleted with it by the retention. NULL until a run fails: a
-- nullable column without a default is a catalog change only, no table rewrite.

-- +goose Up
ALTER TABLE {{schema}}.delayq_outbox ADD COLUMN IF NOT EXISTS attempt_log jsonb;

-- +goose Down
ALTER TABLE {{schema}}.delayq_outbox DROP COLUMN IF EXISTS attempt_log;
