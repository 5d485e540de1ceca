-- Rows that must reach Redis before the horizon: a queued task rescheduled to a
-- later time keeps its queued_at and goes back to pending, and the relay moves the
-- new version at once, wherever its run_at lies, so that the old version in Redis is
-- replaced before it falls due (docs/DESIGN.md, "reschedule"). Such rows are few and
-- short-lived: the index is almost always empty.
--
-- Concurrently, so that producers and the relay keep writing while it builds.

-- +goose NO TRANSACTION

-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_revoke_idx;
CREATE INDEX CONCURRENTLY delayq_outbox_revoke_idx
    ON {{schema}}.delayq_outbox (run_at)
    WHERE state = 'pending' AND queued_at IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_revoke_idx;
