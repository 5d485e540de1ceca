-- Batches with a callback (issue 33, item 2; docs/DESIGN.md, "Workflows").
--
-- A batch is a set of children enqueued in one transaction (package workflow,
-- Client.Batch) with one callback task, inserted 'waiting', that runs once
-- every child finished. Its row in delayq_batches is the counter: total,
-- remaining, and how many children ended done, dead and cancelled. Each child
-- carries the batch's id in batch_id until it is counted; the callback keeps
-- it for life (it names the counter of which it is the callback).
--
-- Counting is O(1) per finish: the row trigger delayq_outbox_batch, BEFORE
-- UPDATE OF state, runs in the transaction of whichever transition finishes a
-- child (a completion in any form, a death, the reaper, a cancel) and updates
-- the one counter row by its key. It clears the child's batch_id in the same
-- row version (NEW), so a child counts once whatever happens to it later (a
-- dead child retried does not count again) and its update writes no second
-- version. The update that takes remaining to 0 also makes the callback
-- pending, in that same transaction, and notifies the relay at the commit:
-- concurrent finishes serialize on the counter row's lock and each re-reads
-- the count the one before committed (READ COMMITTED), so exactly one sees 0.
-- The counter row is the batch's hot row: held from the finish's update to its
-- commit (BENCHMARKS.md, "Workflows").
--
-- Every other row has batch_id NULL: the trigger's WHEN, a test of a column
-- of the new row, is all it pays. The counter row is deleted with its
-- callback's row (retention, a purge), by the trigger delayq_outbox_batch_gone.
-- The partial index serves the cancel of a batch (its children not finished).

--
-- It also replaces delayq_outbox_release (migration 00021) with the same
-- function but for one fix: a dependent it released (made pending) did not
-- notify the relay, whose poll found it up to PollInterval later (5 s by
-- default; a chain of 1,000 took 5 s a link). The notifications were in a CTE
-- that ran only when the pass also failed or skipped a dependent.

-- +goose NO TRANSACTION

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_outbox_release() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    fq text[] := ARRAY[NEW.queue];
    fid text[] := ARRAY[NEW.task_id];
    fstate text[] := ARRAY[NEW.state];
    ferr text[] := ARRAY[COALESCE(NEW.last_error, '')];
    notes bigint;
BEGIN
    -- Each pass settles the edges of the rows that finished (first the row of
    -- this event, then the dependents the previous pass failed or skipped).
    LOOP
        WITH e AS (
            DELETE FROM {{schema}}.delayq_deps d
            USING unnest(fq, fid, fstate, ferr) AS f(queue, task_id, state, err)
            WHERE d.queue = f.queue AND d.task_id = f.task_id
            RETURNING d.dep_queue, d.dep_task_id, d.on_failure, d.channel,
                      f.queue, f.task_id, f.state, f.err
        ), a AS (
            SELECT dep_queue, dep_task_id, min(channel) AS channel, count(*)::int AS n,
                   -- the reason of the first dependency (in key order) that
                   -- fails, else of the first that skips
                   min(CASE WHEN state <> 'done' AND on_failure = 'fail'
                            THEN 'dependency ' || queue || '/' || task_id || ' ' || state
                                 || CASE WHEN err <> '' THEN ': ' || err ELSE '' END END) AS fail,
                   min(CASE WHEN state <> 'done' AND on_failure = 'skip'
                            THEN 'dependency ' || queue || '/' || task_id || ' ' || state
                                 || CASE WHEN err <> '' THEN ': ' || err ELSE '' END END) AS skip
            FROM e GROUP BY dep_queue, dep_task_id
        ), upd AS (
            UPDATE {{schema}}.delayq_outbox o
            SET waits_for = o.waits_for - a.n,
                state = CASE WHEN a.fail IS NOT NULL THEN 'dead'
                             WHEN a.skip IS NOT NULL THEN 'cancelled'
                             WHEN o.waits_for - a.n <= 0 THEN 'pending'
                             ELSE 'waiting' END,
                last_error = COALESCE(left(a.fail, 1024), left(a.skip, 1024), o.last_error),
                done_at = CASE WHEN a.fail IS NOT NULL OR a.skip IS NOT NULL THEN statement_timestamp() END,
                hook_due = CASE WHEN a.fail IS NOT NULL THEN statement_timestamp() END,
                -- a row this pass finishes is settled by the next pass, not by a
                -- nested trigger
                has_dependents = CASE WHEN a.fail IS NOT NULL OR a.skip IS NOT NULL THEN NULL ELSE o.has_dependents END
            FROM a
            WHERE o.queue = a.dep_queue AND o.task_id = a.dep_task_id AND o.state = 'waiting'
            RETURNING o.queue, o.task_id, o.state, COALESCE(o.last_error, '') AS err, a.channel
        ), n AS (
            -- the relay hears of a release at the commit; the workers sweeping a
            -- queue's OnDead hooks hear of a failed dependent
            SELECT count(pg_notify(CASE WHEN state = 'pending' THEN channel
                                        ELSE left(channel, 58) || '_dead' END, queue)) AS c
            FROM (SELECT DISTINCT queue, state, channel FROM upd WHERE state IN ('pending', 'dead')) AS x
        )
        -- n in the select list of an aggregate, which returns one row: it
        -- runs whatever upd holds (joined to upd's dead and cancelled rows,
        -- as in 00021, it never ran for a release alone)
        SELECT (SELECT c FROM n),
               array_agg(u.queue) FILTER (WHERE u.state IN ('dead', 'cancelled')),
               array_agg(u.task_id) FILTER (WHERE u.state IN ('dead', 'cancelled')),
               array_agg(u.state) FILTER (WHERE u.state IN ('dead', 'cancelled')),
               array_agg(u.err) FILTER (WHERE u.state IN ('dead', 'cancelled'))
        INTO notes, fq, fid, fstate, ferr
        FROM upd u;
        EXIT WHEN fq IS NULL;
    END LOOP;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

ALTER TABLE {{schema}}.delayq_outbox ADD COLUMN IF NOT EXISTS batch_id bigint;

CREATE SEQUENCE IF NOT EXISTS {{schema}}.delayq_batches_id_seq;

-- One row per batch: queue/task_id its callback; channel the relay's
-- notification channel, for the release.
CREATE TABLE IF NOT EXISTS {{schema}}.delayq_batches (
    id          bigint PRIMARY KEY DEFAULT nextval('{{schema}}.delayq_batches_id_seq'),
    queue       text NOT NULL,
    task_id     text NOT NULL,
    total       integer NOT NULL,
    remaining   integer NOT NULL,
    done        integer NOT NULL DEFAULT 0,
    dead        integer NOT NULL DEFAULT 0,
    cancelled   integer NOT NULL DEFAULT 0,
    channel     text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT statement_timestamp(),
    finished_at timestamptz,
    CONSTRAINT delayq_batches_callback_key UNIQUE (queue, task_id)
);
ALTER SEQUENCE {{schema}}.delayq_batches_id_seq OWNED BY {{schema}}.delayq_batches.id;

DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_batch_idx;
CREATE INDEX CONCURRENTLY delayq_outbox_batch_idx
    ON {{schema}}.delayq_outbox (batch_id)
    WHERE batch_id IS NOT NULL;

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

DROP TRIGGER IF EXISTS delayq_outbox_batch ON {{schema}}.delayq_outbox;
CREATE TRIGGER delayq_outbox_batch
    BEFORE UPDATE OF state ON {{schema}}.delayq_outbox
    FOR EACH ROW WHEN (NEW.batch_id IS NOT NULL AND NEW.state IN ('done', 'dead', 'cancelled'))
    EXECUTE FUNCTION {{schema}}.delayq_outbox_batch();

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_outbox_batch_gone() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {{schema}}.delayq_batches
    WHERE id = OLD.batch_id AND queue = OLD.queue AND task_id = OLD.task_id;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP TRIGGER IF EXISTS delayq_outbox_batch_gone ON {{schema}}.delayq_outbox;
CREATE TRIGGER delayq_outbox_batch_gone
    AFTER DELETE ON {{schema}}.delayq_outbox
    FOR EACH ROW WHEN (OLD.batch_id IS NOT NULL)
    EXECUTE FUNCTION {{schema}}.delayq_outbox_batch_gone();

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_outbox_release() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    fq text[] := ARRAY[NEW.queue];
    fid text[] := ARRAY[NEW.task_id];
    fstate text[] := ARRAY[NEW.state];
    ferr text[] := ARRAY[COALESCE(NEW.last_error, '')];
BEGIN
    -- Each pass settles the edges of the rows that finished (first the row of
    -- this event, then the dependents the previous pass failed or skipped).
    LOOP
        WITH e AS (
            DELETE FROM {{schema}}.delayq_deps d
            USING unnest(fq, fid, fstate, ferr) AS f(queue, task_id, state, err)
            WHERE d.queue = f.queue AND d.task_id = f.task_id
            RETURNING d.dep_queue, d.dep_task_id, d.on_failure, d.channel,
                      f.queue, f.task_id, f.state, f.err
        ), a AS (
            SELECT dep_queue, dep_task_id, min(channel) AS channel, count(*)::int AS n,
                   -- the reason of the first dependency (in key order) that
                   -- fails, else of the first that skips
                   min(CASE WHEN state <> 'done' AND on_failure = 'fail'
                            THEN 'dependency ' || queue || '/' || task_id || ' ' || state
                                 || CASE WHEN err <> '' THEN ': ' || err ELSE '' END END) AS fail,
                   min(CASE WHEN state <> 'done' AND on_failure = 'skip'
                            THEN 'dependency ' || queue || '/' || task_id || ' ' || state
                                 || CASE WHEN err <> '' THEN ': ' || err ELSE '' END END) AS skip
            FROM e GROUP BY dep_queue, dep_task_id
        ), upd AS (
            UPDATE {{schema}}.delayq_outbox o
            SET waits_for = o.waits_for - a.n,
                state = CASE WHEN a.fail IS NOT NULL THEN 'dead'
                             WHEN a.skip IS NOT NULL THEN 'cancelled'
                             WHEN o.waits_for - a.n <= 0 THEN 'pending'
                             ELSE 'waiting' END,
                last_error = COALESCE(left(a.fail, 1024), left(a.skip, 1024), o.last_error),
                done_at = CASE WHEN a.fail IS NOT NULL OR a.skip IS NOT NULL THEN statement_timestamp() END,
                hook_due = CASE WHEN a.fail IS NOT NULL THEN statement_timestamp() END,
                -- a row this pass finishes is settled by the next pass, not by a
                -- nested trigger
                has_dependents = CASE WHEN a.fail IS NOT NULL OR a.skip IS NOT NULL THEN NULL ELSE o.has_dependents END
            FROM a
            WHERE o.queue = a.dep_queue AND o.task_id = a.dep_task_id AND o.state = 'waiting'
            RETURNING o.queue, o.task_id, o.state, COALESCE(o.last_error, '') AS err, a.channel
        ), n AS (
            -- the relay hears of a release at the commit; the workers sweeping a
            -- queue's OnDead hooks hear of a failed dependent
            SELECT count(pg_notify(CASE WHEN state = 'pending' THEN channel
                                        ELSE left(channel, 58) || '_dead' END, queue)) AS c
            FROM (SELECT DISTINCT queue, state, channel FROM upd WHERE state IN ('pending', 'dead')) AS x
        )
        SELECT array_agg(u.queue), array_agg(u.task_id), array_agg(u.state), array_agg(u.err)
        INTO fq, fid, fstate, ferr
        FROM upd u, n
        WHERE u.state IN ('dead', 'cancelled');
        EXIT WHEN fq IS NULL;
    END LOOP;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP TRIGGER IF EXISTS delayq_outbox_batch_gone ON {{schema}}.delayq_outbox;
DROP TRIGGER IF EXISTS delayq_outbox_batch ON {{schema}}.delayq_outbox;
DROP FUNCTION IF EXISTS {{schema}}.delayq_outbox_batch_gone();
DROP FUNCTION IF EXISTS {{schema}}.delayq_outbox_batch();
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_batch_idx;
-- A callback still waiting has nothing left to release it: cancelled with the
-- reason.
UPDATE {{schema}}.delayq_outbox SET state = 'cancelled', done_at = now(),
    last_error = 'migration 00024 rolled back while the batch callback waited'
WHERE state = 'waiting' AND batch_id IS NOT NULL AND waits_for IS NULL;
DROP TABLE IF EXISTS {{schema}}.delayq_batches;
ALTER TABLE {{schema}}.delayq_outbox DROP COLUMN IF EXISTS batch_id;
