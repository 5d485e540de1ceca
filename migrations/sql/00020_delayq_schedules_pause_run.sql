-- The operator's actions on a schedule (issue 32): pause and resume, and run one
-- tick now. paused_at is set while a schedule is paused (NULL: running); every
-- runner reads it under the row's lock at each evaluation, so once a pause has
-- committed no runner enqueues another tick of it, and the ticks that fall
-- meanwhile are counted as missed. resumed_at is the last resume: the ticks up to
-- it fell while paused (missed, never enqueued), the schedule goes on after it.
-- payload and max_attempts are what each tick's task carries, written by the
-- runner at each evaluation, so that a manual run (delayq schedules run, the
-- dashboard) enqueues the same task without the schedule's declaration; NULL until
-- a runner of this version evaluated the schedule. last_run_id and last_run_at
-- name the last manual run's task and when it was enqueued. Nullable columns
-- without a default: a catalog change, no rewrite.

-- +goose Up
ALTER TABLE {{schema}}.delayq_schedules
    ADD COLUMN IF NOT EXISTS paused_at timestamptz,
    ADD COLUMN IF NOT EXISTS resumed_at timestamptz,
    ADD COLUMN IF NOT EXISTS payload bytea,
    ADD COLUMN IF NOT EXISTS max_attempts integer,
    ADD COLUMN IF NOT EXISTS last_run_id text,
    ADD COLUMN IF NOT EXISTS last_run_at timestamptz;

-- +goose Down
ALTER TABLE {{schema}}.delayq_schedules
    DROP COLUMN IF EXISTS paused_at,
    DROP COLUMN IF EXISTS resumed_at,
    DROP COLUMN IF EXISTS payload,
    DROP COLUMN IF EXISTS max_attempts,
    DROP COLUMN IF EXISTS last_run_id,
    DROP COLUMN IF EXISTS last_run_at;
