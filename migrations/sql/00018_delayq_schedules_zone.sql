-- What `delayq schedules` shows (package schedule): the zone a schedule's next
-- tick is shown in, and the last tick actually enqueued (last_tick is the runner's
-- cursor: it starts where a schedule is first seen and moves over dropped ticks
-- too). Both are written by the runner at each evaluation; last_enqueued stays
-- NULL until a tick is enqueued. A catalog change, no rewrite.

-- +goose Up
ALTER TABLE {{schema}}.delayq_schedules
    ADD COLUMN IF NOT EXISTS time_zone text NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS last_enqueued timestamptz;

-- +goose Down
ALTER TABLE {{schema}}.delayq_schedules
    DROP COLUMN IF EXISTS time_zone,
    DROP COLUMN IF EXISTS last_enqueued;
