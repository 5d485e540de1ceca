-- The index of queued rows keeps only the queue: the relay lists the queues that
-- have queued rows (a loose index scan) and counts them, and neither needs the task
-- id. Keyed on (queue, task_id) the index took as many bytes per queued row as the
-- primary key (about 67 B); keyed on the queue alone, B-tree deduplication stores each
-- queue once per page, about 7 B per row (TestRowSize, BENCHMARKS.md).
--
-- Concurrently, so that producers and the relay keep writing while it builds. Each
-- step can be run again after a failure: a half-built index from a failed attempt is
-- dropped first.

-- +goose NO TRANSACTION

-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_queued_queue_idx;
CREATE INDEX CONCURRENTLY delayq_outbox_queued_queue_idx
    ON {{schema}}.delayq_outbox (queue)
    WHERE state = 'queued';
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_queued_idx;
ALTER INDEX {{schema}}.delayq_outbox_queued_queue_idx RENAME TO delayq_outbox_queued_idx;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_queued_key_idx;
CREATE INDEX CONCURRENTLY delayq_outbox_queued_key_idx
    ON {{schema}}.delayq_outbox (queue, task_id)
    WHERE state = 'queued';
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_queued_idx;
ALTER INDEX {{schema}}.delayq_outbox_queued_key_idx RENAME TO delayq_outbox_queued_idx;
