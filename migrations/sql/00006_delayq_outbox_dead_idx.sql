-- Dead rows wait for a person and are few: an index of them alone, keyed by queue
-- and time of death, counts them exactly at every refresh of the relay's gauges
-- (whatever the size of the table), and serves the dead-letter lists, newest first,
-- of one queue or of all. Concurrently, so that producers and the relay keep
-- writing while it builds.

-- +goose NO TRANSACTION

-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_dead_idx;
CREATE INDEX CONCURRENTLY delayq_outbox_dead_idx
    ON {{schema}}.delayq_outbox (queue, done_at)
    WHERE state = 'dead';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_dead_idx;
