-- A task's start deadline ("must start by"), NULL for none: the relay carries it
-- into the Redis task hash (field d, only when set), and a claim after it settles
-- the task without running it (transition miss-deadline). Adding a nullable
-- column without a default rewrites nothing.

-- +goose Up
ALTER TABLE {{schema}}.delayq_outbox ADD COLUMN IF NOT EXISTS start_by timestamptz;

-- +goose Down
ALTER TABLE {{schema}}.delayq_outbox DROP COLUMN IF EXISTS start_by;
