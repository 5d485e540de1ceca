-- A task's priority within its queue (outbox.Task.Priority): 0..9, higher runs first
-- among the tasks already due; 0, the default, is the lowest. The relay carries it
-- into the Redis task hash (field y, only when not 0) and the queue's priority index
-- (docs/DESIGN.md, "Priorities within a queue").
--
-- Without a table rewrite or a long lock: a NOT NULL column with a constant default
-- is a catalog change (Postgres 11+; existing rows read the default). The CHECK is
-- added NOT VALID (a brief lock, no scan), then validated in its own transaction,
-- which scans the table under a lock that lets producers, the relay and workers
-- write meanwhile. Each step can be run again after a failure.

-- +goose NO TRANSACTION

-- +goose Up
ALTER TABLE {{schema}}.delayq_outbox ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0;
ALTER TABLE {{schema}}.delayq_outbox DROP CONSTRAINT IF EXISTS delayq_outbox_priority_check;
ALTER TABLE {{schema}}.delayq_outbox ADD CONSTRAINT delayq_outbox_priority_check CHECK (priority BETWEEN 0 AND 9) NOT VALID;
ALTER TABLE {{schema}}.delayq_outbox VALIDATE CONSTRAINT delayq_outbox_priority_check;

-- +goose Down
ALTER TABLE {{schema}}.delayq_outbox DROP CONSTRAINT IF EXISTS delayq_outbox_priority_check;
ALTER TABLE {{schema}}.delayq_outbox DROP COLUMN IF EXISTS priority;
