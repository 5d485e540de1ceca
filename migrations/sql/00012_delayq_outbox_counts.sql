-- What delayq stats and the dashboard count, at a cost independent of the table's
-- size (docs/DESIGN.md, "Counting"):
--
-- * The pending index carries the queue (INCLUDE), so the pending rows of each queue
--   and the relay lag (the oldest due pending row per queue) are counted by an
--   index-only scan of the pending rows, not by reading the table's pages where they
--   lie. The relay's scan is unchanged (same key, same predicate, same name); an entry
--   grows by the queue name, and a write makes no extra index insertion.
-- * Extended statistics of (queue, state) let the done and cancelled rows of each
--   queue be estimated from the planner's statistics (ANALYZE, autovacuum) instead
--   of counted: they are history, and counting them read every row.
--
-- Concurrently, so that producers and the relay keep writing while it builds. Each
-- step can be run again after a failure: a half-built index from a failed attempt is
-- dropped first.

-- +goose NO TRANSACTION

-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_pending_queue_idx;
CREATE INDEX CONCURRENTLY delayq_outbox_pending_queue_idx
    ON {{schema}}.delayq_outbox (run_at) INCLUDE (queue)
    WHERE state = 'pending';
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_pending_run_at_idx;
ALTER INDEX {{schema}}.delayq_outbox_pending_queue_idx RENAME TO delayq_outbox_pending_run_at_idx;
DROP STATISTICS IF EXISTS {{schema}}.delayq_outbox_queue_state;
CREATE STATISTICS {{schema}}.delayq_outbox_queue_state (mcv) ON queue, state FROM {{schema}}.delayq_outbox;

-- +goose Down
DROP STATISTICS IF EXISTS {{schema}}.delayq_outbox_queue_state;
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_pending_key_idx;
CREATE INDEX CONCURRENTLY delayq_outbox_pending_key_idx
    ON {{schema}}.delayq_outbox (run_at)
    WHERE state = 'pending';
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_pending_run_at_idx;
ALTER INDEX {{schema}}.delayq_outbox_pending_key_idx RENAME TO delayq_outbox_pending_run_at_idx;
