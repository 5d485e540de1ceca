-- A skipped notification carried by a late commit (docs/DESIGN.md, "Waking the
-- relay"). An Enqueue that left its notification out (outbox Config.NotifyCooldown:
-- a committed enqueue into its queue notified moments before, and the relay's
-- follow-up rounds after that wake-up move this task too) sets notify_late to its
-- channel; every other row keeps it NULL. For those rows only (the WHEN is
-- evaluated at insert), a deferred constraint trigger runs at the inserting
-- transaction's commit and notifies there if that transaction began 25 ms or more
-- before: a commit that late may come after the follow-up rounds ended, and would
-- otherwise wait for the relay's poll. EnqueueMany, plain INSERTs and every update
-- queue no trigger event. A rolled-back transaction (or savepoint) fires nothing.
--
-- The measure is from the transaction's start (created_at), which is never after
-- the enqueue: it errs towards notifying. Identical notifications of one
-- transaction are folded by Postgres, so several late rows of a queue notify once.
--
-- The nullable column without a default is a catalog change: no rewrite.

-- +goose Up
ALTER TABLE {{schema}}.delayq_outbox ADD COLUMN IF NOT EXISTS notify_late text;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_outbox_notify_late() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF clock_timestamp() >= NEW.created_at + interval '25 milliseconds' THEN
        PERFORM pg_notify(NEW.notify_late, NEW.queue);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP TRIGGER IF EXISTS delayq_outbox_notify_late ON {{schema}}.delayq_outbox;
CREATE CONSTRAINT TRIGGER delayq_outbox_notify_late
    AFTER INSERT ON {{schema}}.delayq_outbox
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.notify_late IS NOT NULL)
    EXECUTE FUNCTION {{schema}}.delayq_outbox_notify_late();

-- +goose Down
DROP TRIGGER IF EXISTS delayq_outbox_notify_late ON {{schema}}.delayq_outbox;
DROP FUNCTION IF EXISTS {{schema}}.delayq_outbox_notify_late();
ALTER TABLE {{schema}}.delayq_outbox DROP COLUMN IF EXISTS notify_late;
