-- The hook-pending mark (docs/DESIGN.md, "Hooks that commit with the task"): a death
-- recorded without the queue's OnDead hook in its transaction (the reaper's, after a
-- worker crashed or lost its lease on the task's last attempt; the relay's, for a row
-- Redis refuses) sets hook_due to when the hook is due. A worker that serves the queue
-- with a hook takes the row, runs the hook and clears the mark in one transaction; a
-- hook that fails puts the mark back, later. NULL, the value of every other row, is no
-- mark: a live row pays nothing for the column (its null bitmap has a bit to spare: 16
-- columns fit in the same 2 bytes as 15, TestRowSize), and a nullable column without a
-- default rewrites nothing.
--
-- The index holds the marked rows alone (a worker's sweep and its next due time), so
-- it costs the other rows nothing, and no write that leaves hook_due NULL touches it.
-- Concurrently, so that producers and the relay keep writing while it builds; each
-- step can be run again after a failure.

-- +goose NO TRANSACTION

-- +goose Up
ALTER TABLE {{schema}}.delayq_outbox ADD COLUMN IF NOT EXISTS hook_due timestamptz;
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_hook_due_idx;
CREATE INDEX CONCURRENTLY delayq_outbox_hook_due_idx
    ON {{schema}}.delayq_outbox (queue, hook_due)
    WHERE hook_due IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_hook_due_idx;
ALTER TABLE {{schema}}.delayq_outbox DROP COLUMN IF EXISTS hook_due;
