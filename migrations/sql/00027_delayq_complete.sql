-- The completion of a run from SQL (issue 35, item 2): delayq_complete marks a
-- task done in the caller's transaction, so that a worker in any language
-- (`delayq worker --exec CMD --transactional`, docs/worker-protocol.md) commits its
-- effect and the completion together or not at all. It is the Go transactional
-- handler's guard (internal/taskstate's Guard): the row becomes done only if it is
-- still pending or queued at the version the run holds; otherwise it raises, and
-- the caller's transaction, effect included, cannot commit:
--
--   QD001 invalid queue name   QD002 invalid task id   QD017 invalid version
--   QD020 task not found       QD021 task already finished (done, dead, cancelled)
--   QD022 stale run: the task holds another version (rescheduled, retried from
--         dead), or waits on other tasks
--
-- Two runs of one version that complete at once: the second's update waits for
-- the first's row lock, then finds the row done (QD021; 40001 under REPEATABLE
-- READ or SERIALIZABLE). The payload is emptied when delayq.clear_payload_on_done
-- is on, as delayq_cancel does. SECURITY INVOKER: the role needs the outbox's
-- SELECT and UPDATE.

-- +goose Up

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_complete(queue text, task_id text, version integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    bad text;
    st text;
    v integer;
BEGIN
    bad := {{schema}}.delayq_task_error(queue, task_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
    IF bad IS NOT NULL THEN
        RAISE USING ERRCODE = left(bad, 5), MESSAGE = format('complete: %s', substr(bad, 7));
    END IF;
    IF version IS NULL OR version < 1 THEN
        RAISE USING ERRCODE = 'QD017', MESSAGE = format('complete %s/%s: invalid version %s: the run''s DELAYQ_VERSION, 1 or more',
            queue, task_id, COALESCE(version::text, 'NULL'));
    END IF;
    UPDATE {{schema}}.delayq_outbox o
    SET state = 'done', done_at = statement_timestamp(),
        payload = CASE WHEN current_setting('delayq.clear_payload_on_done', true) IN ('on', 'true', '1') THEN ''::bytea ELSE o.payload END
    WHERE o.queue = delayq_complete.queue AND o.task_id = delayq_complete.task_id
      AND o.version = delayq_complete.version AND o.state IN ('pending', 'queued');
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT o.state, o.version INTO st, v FROM {{schema}}.delayq_outbox o
    WHERE o.queue = delayq_complete.queue AND o.task_id = delayq_complete.task_id;
    IF NOT FOUND THEN
        RAISE USING ERRCODE = 'QD020', MESSAGE = format('complete %s/%s: task not found', queue, task_id);
    ELSIF st IN ('done', 'dead', 'cancelled') THEN
        RAISE USING ERRCODE = 'QD021', MESSAGE = format('complete %s/%s: task already finished (state %s)', queue, task_id, st);
    ELSIF v <> version THEN
        RAISE USING ERRCODE = 'QD022', MESSAGE = format('complete %s/%s: stale run: the task holds version %s, this run version %s',
            queue, task_id, v, version);
    END IF;
    RAISE USING ERRCODE = 'QD022', MESSAGE = format('complete %s/%s: stale run: the task is %s', queue, task_id, st);
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS {{schema}}.delayq_complete(text, text, integer);
