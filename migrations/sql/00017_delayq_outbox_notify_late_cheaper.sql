-- The late commit's notification (migration 00015) at less cost: the trigger's
-- function measures the transaction's age by transaction_timestamp(), which is the
-- row's created_at (its default, now(), is the inserting transaction's start, and
-- the trigger runs in that transaction), so it reads no field of NEW unless it
-- notifies: PL/pgSQL then never deforms the row. A profile of the commit of a marked
-- row put the trigger at 4-5 us of the server's CPU, its function's part 1.8 us
-- before and 1.4 us after (BENCHMARKS.md, issue 29: the late-commit wake-up's
-- cost). Same trigger, same column, same behaviour.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_outbox_notify_late() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF clock_timestamp() >= transaction_timestamp() + interval '25 milliseconds' THEN
        PERFORM pg_notify(NEW.notify_late, NEW.queue);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
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
