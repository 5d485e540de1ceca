-- Sharded batch counters (issue 33, item 8; docs/DESIGN.md, "Workflows").
--
-- 00024 counted every child's finish in its batch's one row of delayq_batches,
-- held locked from the finish's update to its commit: the finishes of one batch
-- did not share a commit flush (a child cost 2.5-3.5 plain tasks). Here a batch
-- enqueued from now on spreads its count over up to 16 rows of
-- delayq_batch_shards, (batch_id, shard): each child gets a shard at the insert
-- (its position in the key-sorted batch mod K, K = min(16, children)) in the
-- column batch_shard, and its finish updates only that shard's row, so K
-- finishes of one batch commit side by side.
--
-- The release: the finish that takes a shard's remaining to 0 then updates the
-- batch's row (zero_shards + 1). Only those K events meet on that row; under
-- READ COMMITTED each re-reads the count the previous one committed, so exactly
-- one sees zero_shards = shards and makes the callback pending (as in 00024, in
-- its own transaction, the relay notified at the commit). Under REPEATABLE READ
-- or SERIALIZABLE an update of a row changed since the snapshot fails with
-- 40001 (retried), never a missed release. No sum over the shards decides: a
-- snapshot can miss a concurrent commit.
--
-- The batch's row keeps total, zero_shards and shards; its remaining, done,
-- dead and cancelled stay 0 for a sharded batch, so the counts are always the
-- row's plus the sum of its shards' (taskstate BatchRow), whichever kind.
-- Batches enqueued before this migration keep their one counter row: their
-- children have no batch_shard, and the trigger counts them as 00024 did.
--
-- A shard row goes with its batch's row (ON DELETE CASCADE: the callback's
-- deletion, delayq_outbox_batch_gone). A transaction that finishes several
-- children of one batch in one statement would lock their shards in the
-- update's order, which another such transaction may take in another order:
-- the guards of many tasks (taskstate GuardMany, GuardGroup) lock the shard
-- rows of their children first, sorted, before the update.

-- +goose Up
ALTER TABLE {{schema}}.delayq_outbox ADD COLUMN IF NOT EXISTS batch_shard smallint;
ALTER TABLE {{schema}}.delayq_batches
    ADD COLUMN IF NOT EXISTS shards smallint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS zero_shards smallint NOT NULL DEFAULT 0;

-- fillfactor: a shard row is updated once per finish of its children; room in
-- its page keeps those updates HOT.
CREATE TABLE IF NOT EXISTS {{schema}}.delayq_batch_shards (
    batch_id  bigint NOT NULL REFERENCES {{schema}}.delayq_batches (id) ON DELETE CASCADE,
    shard     smallint NOT NULL,
    remaining integer NOT NULL,
    done      integer NOT NULL DEFAULT 0,
    dead      integer NOT NULL DEFAULT 0,
    cancelled integer NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, shard)
) WITH (fillfactor = 50);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_outbox_batch() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    b record;
BEGIN
    IF NEW.batch_shard IS NULL THEN
        -- A child of a batch enqueued before 00030 (one counter row), or the
        -- callback, which matches no counter row: 00024's count.
        UPDATE {{schema}}.delayq_batches
        SET remaining = remaining - 1,
            done = done + (NEW.state = 'done')::int,
            dead = dead + (NEW.state = 'dead')::int,
            cancelled = cancelled + (NEW.state = 'cancelled')::int,
            finished_at = CASE WHEN remaining = 1 THEN statement_timestamp() END
        WHERE id = NEW.batch_id AND (queue, task_id) <> (NEW.queue, NEW.task_id)
        RETURNING remaining = 0 AS last, queue, task_id, channel INTO b;
        IF NOT FOUND THEN
            RETURN NEW;
        END IF;
    ELSE
        UPDATE {{schema}}.delayq_batch_shards
        SET remaining = remaining - 1,
            done = done + (NEW.state = 'done')::int,
            dead = dead + (NEW.state = 'dead')::int,
            cancelled = cancelled + (NEW.state = 'cancelled')::int
        WHERE batch_id = NEW.batch_id AND shard = NEW.batch_shard
        RETURNING remaining INTO b;
        IF NOT FOUND THEN
            -- the batch is gone (its callback deleted): nothing to count
            RETURN NEW;
        END IF;
        IF b.remaining <> 0 THEN
            NEW.batch_id := NULL;
            NEW.batch_shard := NULL;
            RETURN NEW;
        END IF;
        -- This shard is through: the K such events of a batch serialize here.
        UPDATE {{schema}}.delayq_batches
        SET zero_shards = zero_shards + 1,
            finished_at = CASE WHEN zero_shards + 1 = shards THEN statement_timestamp() END
        WHERE id = NEW.batch_id
        RETURNING zero_shards = shards AS last, queue, task_id, channel INTO b;
    END IF;
    -- Counted: the child leaves the batch in this same row version.
    NEW.batch_id := NULL;
    NEW.batch_shard := NULL;
    IF b.last THEN
        -- a callback cancelled (or finished) meanwhile stays as it is
        UPDATE {{schema}}.delayq_outbox SET state = 'pending'
        WHERE queue = b.queue AND task_id = b.task_id AND state = 'waiting';
        IF FOUND THEN
            PERFORM pg_notify(b.channel, b.queue);
        END IF;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- delayq_lock_batch_shards locks the shard rows named by batch_ids[i], shards[i],
-- sorted, and returns how many it locked: the guards of many completions
-- (GuardMany, GuardGroup) call it before their update, whose trigger would
-- otherwise lock the rows in the update's order, which another such statement
-- may take in another (a deadlock). A function rather than a subquery of the
-- guards, so that a role finishing tasks outside any batch needs no privilege on
-- the shards: with NULL arrays (no batch child among the rows) it returns at
-- once and never reads the table.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_lock_batch_shards(batch_ids bigint[], shards integer[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    IF batch_ids IS NULL THEN
        RETURN 0;
    END IF;
    SELECT count(*) INTO n FROM (
        SELECT FROM {{schema}}.delayq_batch_shards s
        WHERE (s.batch_id, s.shard) IN (SELECT * FROM unnest(batch_ids, shards))
        ORDER BY s.batch_id, s.shard
        FOR UPDATE OF s
    ) AS x;
    RETURN n;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The shards' counts go back into their batches' rows, which 00024's trigger
-- counts on: a child keeps its batch_id, and only the shard is forgotten.
UPDATE {{schema}}.delayq_batches b
SET remaining = b.remaining + s.remaining, done = b.done + s.done,
    dead = b.dead + s.dead, cancelled = b.cancelled + s.cancelled
FROM (SELECT batch_id, sum(remaining)::int AS remaining, sum(done)::int AS done,
             sum(dead)::int AS dead, sum(cancelled)::int AS cancelled
      FROM {{schema}}.delayq_batch_shards GROUP BY batch_id) AS s
WHERE b.id = s.batch_id;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_outbox_batch() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    b record;
BEGIN
    -- The callback's own finish matches no counter row here: it keeps its
    -- batch_id, and nothing is counted.
    UPDATE {{schema}}.delayq_batches
    SET remaining = remaining - 1,
        done = done + (NEW.state = 'done')::int,
        dead = dead + (NEW.state = 'dead')::int,
        cancelled = cancelled + (NEW.state = 'cancelled')::int,
        finished_at = CASE WHEN remaining = 1 THEN statement_timestamp() END
    WHERE id = NEW.batch_id AND (queue, task_id) <> (NEW.queue, NEW.task_id)
    RETURNING remaining, queue, task_id, channel INTO b;
    IF NOT FOUND THEN
        RETURN NEW;
    END IF;
    NEW.batch_id := NULL;
    IF b.remaining = 0 THEN
        -- a callback cancelled (or finished) meanwhile stays as it is
        UPDATE {{schema}}.delayq_outbox SET state = 'pending'
        WHERE queue = b.queue AND task_id = b.task_id AND state = 'waiting';
        IF FOUND THEN
            PERFORM pg_notify(b.channel, b.queue);
        END IF;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

DROP FUNCTION IF EXISTS {{schema}}.delayq_lock_batch_shards(bigint[], integer[]);
DROP TABLE IF EXISTS {{schema}}.delayq_batch_shards;
ALTER TABLE {{schema}}.delayq_batches DROP COLUMN IF EXISTS shards, DROP COLUMN IF EXISTS zero_shards;
ALTER TABLE {{schema}}.delayq_outbox DROP COLUMN IF EXISTS batch_shard;
