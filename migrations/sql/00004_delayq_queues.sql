-- Per-queue controls, the truth of what Redis mirrors (dq:{queue}:ctl): a paused
-- queue is claimed by no worker; a rate limit caps the starts of a queue across all
-- workers. version is bumped by every change, and the Redis mirror applies a
-- setting only over an older one, so a late mirror write never undoes a newer
-- change (docs/DESIGN.md, the write-order rule). Rows are never deleted: a resumed
-- queue is a row with paused false.

-- +goose Up
CREATE TABLE {{schema}}.delayq_queues (
    queue       text        NOT NULL PRIMARY KEY,
    paused      boolean     NOT NULL DEFAULT false,
    rate_limit  integer     NOT NULL DEFAULT 0 CHECK (rate_limit >= 0),
    rate_period_ms bigint   NOT NULL DEFAULT 1000 CHECK (rate_period_ms > 0),
    rate_burst  integer     NOT NULL DEFAULT 1 CHECK (rate_burst >= 1),
    version     bigint      NOT NULL DEFAULT 1,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE IF EXISTS {{schema}}.delayq_queues;
