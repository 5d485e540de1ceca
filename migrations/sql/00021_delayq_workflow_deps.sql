-- Dependencies between tasks (issue 33; docs/DESIGN.md, "Workflows").
--
-- A task enqueued waiting on other tasks (package workflow) is inserted in the
-- state 'waiting', which the relay never moves (it takes 'pending' rows), with
-- waits_for, the number of its dependencies still unfinished; each such
-- dependency gets an edge in delayq_deps and the flag has_dependents on its own
-- row. When a flagged row finishes (done, dead or cancelled, by any transition:
-- a worker's completion or failure, the reaper, a cancel), the trigger
-- delayq_outbox_release runs in that transition's transaction and settles its
-- edges: each dependent counts the dependency finished, or is failed (dead) or
-- skipped (cancelled) as the edge's policy says when the dependency did not end
-- done; the dependent whose count reaches 0 becomes 'pending' (due at its own
-- run_at, or at once if that passed) and the relay is notified at the commit.
-- No scan, no leader: the release commits with the last dependency's finish, or
-- not at all.
--
-- Every other row keeps has_dependents NULL, so the trigger's WHEN, a test of a
-- column of the new row, is all a completion without dependents pays. Edges are
-- deleted as they settle: a dependency finishes once per edge whatever happens
-- later (a dead retry of it finds no edge left), and the table holds only the
-- edges still waiting.
--
-- A dependent that the trigger fails or skips is finished by the same loop, which
-- then settles that dependent's own edges (a chain that fails stops in one
-- statement per link, without nesting triggers: the rows it finishes have their
-- flag cleared in the same update, so no nested event is queued).
--
-- The nullable columns without a default are catalog changes: no rewrite. The
-- state's CHECK is replaced NOT VALID and then validated, which scans the table
-- under a lock that lets writes go on; the index of waiting rows (the exact
-- count of delayq stats, as for pending, queued and dead) is built
-- concurrently. So the migration runs outside a transaction, each statement
-- written to be run again after a failure.

-- +goose NO TRANSACTION

-- +goose Up
ALTER TABLE {{schema}}.delayq_outbox ADD COLUMN IF NOT EXISTS waits_for integer;
ALTER TABLE {{schema}}.delayq_outbox ADD COLUMN IF NOT EXISTS has_dependents boolean;
-- A transactional handler's result (workflow.Client.SetResult), written in the
-- run's own transaction, so it commits with the completion or not at all; at
-- most 4 KiB (the client checks); kept and deleted with the row.
ALTER TABLE {{schema}}.delayq_outbox ADD COLUMN IF NOT EXISTS result bytea;

ALTER TABLE {{schema}}.delayq_outbox DROP CONSTRAINT IF EXISTS delayq_outbox_state_check;
ALTER TABLE {{schema}}.delayq_outbox ADD CONSTRAINT delayq_outbox_state_check
    CHECK (state IN ('pending', 'queued', 'done', 'dead', 'cancelled', 'waiting')) NOT VALID;
ALTER TABLE {{schema}}.delayq_outbox VALIDATE CONSTRAINT delayq_outbox_state_check;

DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_waiting_idx;
CREATE INDEX CONCURRENTLY delayq_outbox_waiting_idx
    ON {{schema}}.delayq_outbox (queue)
    WHERE state = 'waiting';

-- One row per dependency of a waiting task: queue/task_id the dependency,
-- dep_queue/dep_task_id the dependent. on_failure: what the dependent does when
-- the dependency ends dead or cancelled ('fail': dead; 'skip': cancelled; 'run':
-- counts it finished). channel: the relay's notification channel, for the
-- release.
CREATE TABLE IF NOT EXISTS {{schema}}.delayq_deps (
    queue       text NOT NULL,
    task_id     text NOT NULL,
    dep_queue   text NOT NULL,
    dep_task_id text NOT NULL,
    on_failure  text NOT NULL CHECK (on_failure IN ('fail', 'skip', 'run')),
    channel     text NOT NULL,
    CONSTRAINT delayq_deps_pkey PRIMARY KEY (queue, task_id, dep_queue, dep_task_id)
);

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

DROP TRIGGER IF EXISTS delayq_outbox_release ON {{schema}}.delayq_outbox;
CREATE TRIGGER delayq_outbox_release
    AFTER UPDATE OF state ON {{schema}}.delayq_outbox
    FOR EACH ROW WHEN (NEW.has_dependents AND NEW.state IN ('done', 'dead', 'cancelled'))
    EXECUTE FUNCTION {{schema}}.delayq_outbox_release();

-- +goose Down
DROP TRIGGER IF EXISTS delayq_outbox_release ON {{schema}}.delayq_outbox;
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_outbox_waiting_idx;
DROP FUNCTION IF EXISTS {{schema}}.delayq_outbox_release();
DROP TABLE IF EXISTS {{schema}}.delayq_deps;
-- Rows still waiting cannot be represented before this migration: they are
-- cancelled with the reason.
UPDATE {{schema}}.delayq_outbox SET state = 'cancelled', done_at = now(),
    last_error = 'migration 00021 rolled back while the task waited on dependencies'
WHERE state = 'waiting';
ALTER TABLE {{schema}}.delayq_outbox DROP CONSTRAINT IF EXISTS delayq_outbox_state_check;
ALTER TABLE {{schema}}.delayq_outbox ADD CONSTRAINT delayq_outbox_state_check
    CHECK (state IN ('pending', 'queued', 'done', 'dead', 'cancelled')) NOT VALID;
ALTER TABLE {{schema}}.delayq_outbox VALIDATE CONSTRAINT delayq_outbox_state_check;
ALTER TABLE {{schema}}.delayq_outbox DROP COLUMN IF EXISTS has_dependents;
ALTER TABLE {{schema}}.delayq_outbox DROP COLUMN IF EXISTS waits_for;
ALTER TABLE {{schema}}.delayq_outbox DROP COLUMN IF EXISTS result;
