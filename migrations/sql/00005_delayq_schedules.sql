-- Periodic tasks (package schedule): one row per schedule a relay runs, with the
-- last tick it enqueued. Relays lock a row (FOR UPDATE SKIP LOCKED) to enqueue its
-- ticks and advance last_tick in the same transaction; the tick's task id (name and
-- tick time) and the outbox's unique key make each tick exactly once whatever this
-- table says.

-- +goose Up
CREATE TABLE {{schema}}.delayq_schedules (
    name        text        NOT NULL PRIMARY KEY,
    queue       text        NOT NULL,
    spec        text        NOT NULL,
    last_tick   timestamptz NOT NULL,
    next_tick   timestamptz,
    enqueued    bigint      NOT NULL DEFAULT 0,
    missed      bigint      NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE IF EXISTS {{schema}}.delayq_schedules;
