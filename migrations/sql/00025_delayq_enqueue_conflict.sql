-- The conflict policies of an enqueue (issue 34 item 3): delayq_enqueue gains
-- on_conflict, debounce and max_wait (outbox Task.Replace, KeepRunAt, Debounce,
-- MaxWait; docs/DESIGN.md, "The SQL API" and "Debounce and replace"), and the
-- OUT column outcome: inserted, duplicate, replaced or debounced.
--
--   on_conflict NULL or 'duplicate': as before, an existing key is a duplicate.
--   'replace': a task of the key that has yet to start (pending, waiting, or
--     queued and not yet due) takes the payload and the due time as a new version;
--     'replace_keep_run_at' keeps its due time. 'debounce' (with debounce, the
--     window, in place of delay and run_at): due the window after the enqueue,
--     pushed back so by each enqueue of the key while it has yet to start (never
--     earlier), capped at max_wait (optional; 0 is none) after the first (its
--     created_at). The task's other fields are kept; every such enqueue notifies
--     at commit (no cooldown).
--   A finished task (done, dead, cancelled) is a duplicate; a queued and due one
--   raises QD023 (task due and may be running); an invalid policy QD018.
--
-- A new OUT column changes the function's type, so it is dropped and created
-- again; calls by name or position keep working (SELECT duplicate, due_at FROM
-- delayq_enqueue(...) as before; SELECT * gains the column).

-- +goose Up
DROP FUNCTION IF EXISTS {{schema}}.delayq_enqueue(text, text, bytea, interval, timestamptz, integer, integer, timestamptz, text);

-- +goose StatementBegin
CREATE FUNCTION {{schema}}.delayq_enqueue(
    queue text, task_id text, payload bytea DEFAULT NULL, delay interval DEFAULT NULL,
    run_at timestamptz DEFAULT NULL, max_attempts integer DEFAULT NULL, priority integer DEFAULT NULL,
    start_by timestamptz DEFAULT NULL, trace_context text DEFAULT NULL,
    on_conflict text DEFAULT NULL, debounce interval DEFAULT NULL, max_wait interval DEFAULT NULL,
    OUT duplicate boolean, OUT due_at timestamptz, OUT outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    -- The settings, read without a function call while unset (the common case).
    max_payload integer := CASE WHEN current_setting('delayq.max_payload_bytes', true) IS NULL THEN 65536
        ELSE {{schema}}.delayq_setting('max_payload_bytes', 65536, 1, 16777216, 16777216) END;
    default_attempts integer := CASE WHEN current_setting('delayq.default_max_attempts', true) IS NULL THEN 25
        ELSE {{schema}}.delayq_setting('default_max_attempts', 25, 1, 1000000, NULL) END;
    within integer := CASE WHEN current_setting('delayq.notify_within_ms', true) IS NULL THEN 30000
        ELSE {{schema}}.delayq_setting('notify_within_ms', 30000, 1, 2147483647, 0) END;
    cooldown integer := CASE WHEN current_setting('delayq.notify_cooldown_ms', true) IS NULL THEN 25
        ELSE {{schema}}.delayq_setting('notify_cooldown_ms', 25, 1, 2147483647, 0) END;
    channel text := CASE WHEN current_setting('delayq.notify_channel', true) IS NULL THEN 'delayq_outbox'
        ELSE {{schema}}.delayq_channel() END;
    bad text;
    due timestamptz;
    soon boolean;
    age interval;
    renew boolean := false;
    late text;
    mode integer;
    v integer;
    st text;
    queued timestamptz;
    live boolean;
    running boolean;
    sb timestamptz;
BEGIN
    bad := {{schema}}.delayq_task_error(queue, task_id, octet_length(payload), delay, run_at,
        max_attempts, priority, start_by, trace_context, max_payload, default_attempts);
    IF bad IS NOT NULL THEN
        RAISE USING ERRCODE = left(bad, 5), MESSAGE = substr(bad, 7);
    END IF;
    -- The conflict policy, checked as outbox's checkConflict, after the task.
    IF on_conflict IS NOT NULL AND on_conflict <> 'duplicate' OR debounce IS NOT NULL OR max_wait IS NOT NULL THEN
        mode := CASE on_conflict WHEN 'replace' THEN 1 WHEN 'replace_keep_run_at' THEN 2 WHEN 'debounce' THEN 3 END;
        max_wait := NULLIF(max_wait, interval '0');
        bad := CASE
            WHEN mode IS NULL AND on_conflict IS NOT NULL AND on_conflict <> 'duplicate' THEN
                format('%L: duplicate, replace, replace_keep_run_at or debounce', on_conflict)
            WHEN debounce IS NOT NULL AND mode IS DISTINCT FROM 3 THEN 'debounce without on_conflict => ''debounce'''
            WHEN mode = 3 AND (debounce IS NULL OR debounce < interval '1 microsecond') THEN
                format('debounce %s: at least 1 microsecond', COALESCE(debounce::text, 'NULL'))
            WHEN max_wait < interval '0' THEN format('max_wait %s is negative', max_wait)
            WHEN max_wait IS NOT NULL AND mode IS DISTINCT FROM 3 THEN 'max_wait without debounce'
            WHEN max_wait < debounce THEN format('max_wait %s is shorter than debounce %s', max_wait, debounce)
            WHEN mode = 3 AND (run_at IS NOT NULL OR delay <> interval '0') THEN 'debounce with a delay or run_at: the window is the delay'
            WHEN mode IS NOT NULL AND start_by IS NOT NULL THEN 'a start deadline (start_by) with replace or debounce'
        END;
        IF bad IS NOT NULL THEN
            RAISE USING ERRCODE = 'QD018', MESSAGE = 'invalid task: conflict policy: ' || bad;
        END IF;
    END IF;
    IF mode IS NOT NULL THEN
        -- outbox's EnqueueReplace (internal/taskstate): insert, or replace or
        -- debounce the row of the key while it has yet to start, as a new version.
        INSERT INTO {{schema}}.delayq_outbox AS t (queue, task_id, run_at, payload, max_attempts, trace_context, priority)
        VALUES (queue, task_id,
                CASE WHEN mode = 3 THEN CASE WHEN max_wait IS NOT NULL THEN least(statement_timestamp() + debounce, now() + max_wait)
                                             ELSE statement_timestamp() + debounce END
                     ELSE COALESCE(run_at, statement_timestamp() + COALESCE(delay, interval '0')) END,
                COALESCE(payload, ''::bytea), COALESCE(NULLIF(max_attempts, 0), default_attempts),
                NULLIF(trace_context, ''), COALESCE(priority, 0))
        ON CONFLICT ON CONSTRAINT delayq_outbox_pkey DO UPDATE
        SET payload = excluded.payload,
            run_at = CASE mode WHEN 1 THEN excluded.run_at WHEN 2 THEN t.run_at
                ELSE greatest(t.run_at, CASE WHEN max_wait IS NOT NULL THEN least(statement_timestamp() + debounce, t.created_at + max_wait)
                                             ELSE statement_timestamp() + debounce END) END,
            state = CASE WHEN t.state = 'waiting' THEN 'waiting' ELSE 'pending' END, version = t.version + 1
        WHERE (t.state IN ('pending', 'waiting') OR t.state = 'queued' AND t.run_at > statement_timestamp())
          AND (t.start_by IS NULL OR t.start_by >= greatest(CASE mode WHEN 1 THEN excluded.run_at WHEN 2 THEN t.run_at
                ELSE greatest(t.run_at, CASE WHEN max_wait IS NOT NULL THEN least(statement_timestamp() + debounce, t.created_at + max_wait)
                                             ELSE statement_timestamp() + debounce END) END, statement_timestamp()))
        RETURNING t.version, t.run_at, t.state, t.queued_at INTO v, due_at, st, queued;
        IF FOUND THEN
            duplicate := false;
            outcome := CASE WHEN v = 1 THEN 'inserted' WHEN mode = 3 THEN 'debounced' ELSE 'replaced' END;
            -- Every commit notifies (no cooldown), as a reschedule.
            IF st = 'pending' AND (queued IS NOT NULL OR within = 0 OR due_at < statement_timestamp() + within * interval '1 millisecond') THEN
                PERFORM pg_notify(channel, queue);
            END IF;
            RETURN;
        END IF;
        -- Not applied: the row is locked by the statement above; tell why.
        SELECT o.state IN ('pending', 'queued', 'waiting'), o.state = 'queued' AND o.run_at <= statement_timestamp(), o.start_by
        INTO live, running, sb
        FROM {{schema}}.delayq_outbox o WHERE o.queue = delayq_enqueue.queue AND o.task_id = delayq_enqueue.task_id;
        IF FOUND AND NOT live THEN
            duplicate := true;
            outcome := 'duplicate';
            RETURN;
        ELSIF running THEN
            RAISE USING ERRCODE = 'QD023', MESSAGE = format('enqueue %s/%s: task due and may be running: queued and due, so not replaced; nothing changed', queue, task_id);
        ELSIF sb IS NOT NULL THEN
            RAISE USING ERRCODE = 'QD012', MESSAGE = format(
                'enqueue %s/%s: invalid task: start deadline: the task''s deadline %s is before its new due time: it could never start; nothing changed', queue, task_id, sb);
        END IF;
        RAISE USING ERRCODE = '40001', MESSAGE = format('enqueue %s/%s: the task changed concurrently; try again', queue, task_id);
    END IF;
    due := COALESCE(run_at, statement_timestamp() + COALESCE(delay, interval '0'));
    IF start_by < greatest(due, statement_timestamp()) THEN
        -- Before the due time on the database clock: it could never start; unless
        -- the key exists (a producer's retry after its deadline passed).
        PERFORM FROM {{schema}}.delayq_outbox o WHERE o.queue = delayq_enqueue.queue AND o.task_id = delayq_enqueue.task_id;
        IF FOUND THEN
            duplicate := true;
            outcome := 'duplicate';
            RETURN;
        END IF;
        RAISE USING ERRCODE = 'QD012', MESSAGE = format(
            'invalid task: start deadline: %s is before the task''s due time %s (its run-at, or now plus its delay on the database clock): it could never start',
            start_by, greatest(due, statement_timestamp()));
    END IF;
    soon := within = 0 OR due < statement_timestamp() + within * interval '1 millisecond';
    IF soon AND cooldown > 0 THEN
        -- The cooldown (outbox.Config.NotifyCooldown) with delayq_notifiers for the
        -- Client's memory: an enqueue less than the cooldown after a committed
        -- notifier leans on it (notify_late: migration 00015's trigger notifies at
        -- a late commit); from half-way, one enqueue at a time (the transaction
        -- advisory lock: tried, never waited for) notifies on purpose and records
        -- itself, so a committed notifier is at hand all along. Without a live
        -- notifier an enqueue notifies, and records itself if no one else is.
        SELECT clock_timestamp() - n.sent INTO age FROM {{schema}}.delayq_notifiers n WHERE n.queue = delayq_enqueue.queue;
        IF age < cooldown * interval '1 millisecond' THEN
            IF age >= cooldown * interval '500 microseconds'
               AND pg_try_advisory_xact_lock(hashtextextended('delayq_notifiers {{schema}}.' || queue, 0)) THEN
                renew := true;
            ELSE
                late := channel;
            END IF;
        ELSE
            renew := pg_try_advisory_xact_lock(hashtextextended('delayq_notifiers {{schema}}.' || queue, 0));
        END IF;
    END IF;
    INSERT INTO {{schema}}.delayq_outbox AS t (queue, task_id, run_at, payload, max_attempts, trace_context, start_by, priority, notify_late)
    VALUES (queue, task_id, due, COALESCE(payload, ''::bytea), COALESCE(NULLIF(max_attempts, 0), default_attempts),
            NULLIF(trace_context, ''), start_by, COALESCE(priority, 0), late)
    ON CONFLICT ON CONSTRAINT delayq_outbox_pkey DO NOTHING
    RETURNING t.run_at INTO due_at;
    IF NOT FOUND THEN
        duplicate := true;
        outcome := 'duplicate';
        RETURN;
    END IF;
    duplicate := false;
    outcome := 'inserted';
    IF soon AND late IS NULL THEN
        PERFORM pg_notify(channel, queue);
        IF renew THEN
            INSERT INTO {{schema}}.delayq_notifiers AS n (queue, sent) VALUES (queue, clock_timestamp())
            ON CONFLICT ON CONSTRAINT delayq_notifiers_pkey DO UPDATE SET sent = excluded.sent;
        END IF;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS {{schema}}.delayq_enqueue(text, text, bytea, interval, timestamptz, integer, integer, timestamptz, text, text, interval, interval);
-- 00022's function, as it was.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_enqueue(
    queue text, task_id text, payload bytea DEFAULT NULL, delay interval DEFAULT NULL,
    run_at timestamptz DEFAULT NULL, max_attempts integer DEFAULT NULL, priority integer DEFAULT NULL,
    start_by timestamptz DEFAULT NULL, trace_context text DEFAULT NULL,
    OUT duplicate boolean, OUT due_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    -- The settings, read without a function call while unset (the common case).
    max_payload integer := CASE WHEN current_setting('delayq.max_payload_bytes', true) IS NULL THEN 65536
        ELSE {{schema}}.delayq_setting('max_payload_bytes', 65536, 1, 16777216, 16777216) END;
    default_attempts integer := CASE WHEN current_setting('delayq.default_max_attempts', true) IS NULL THEN 25
        ELSE {{schema}}.delayq_setting('default_max_attempts', 25, 1, 1000000, NULL) END;
    within integer := CASE WHEN current_setting('delayq.notify_within_ms', true) IS NULL THEN 30000
        ELSE {{schema}}.delayq_setting('notify_within_ms', 30000, 1, 2147483647, 0) END;
    cooldown integer := CASE WHEN current_setting('delayq.notify_cooldown_ms', true) IS NULL THEN 25
        ELSE {{schema}}.delayq_setting('notify_cooldown_ms', 25, 1, 2147483647, 0) END;
    channel text := CASE WHEN current_setting('delayq.notify_channel', true) IS NULL THEN 'delayq_outbox'
        ELSE {{schema}}.delayq_channel() END;
    bad text;
    due timestamptz;
    soon boolean;
    age interval;
    renew boolean := false;
    late text;
BEGIN
    bad := {{schema}}.delayq_task_error(queue, task_id, octet_length(payload), delay, run_at,
        max_attempts, priority, start_by, trace_context, max_payload, default_attempts);
    IF bad IS NOT NULL THEN
        RAISE USING ERRCODE = left(bad, 5), MESSAGE = substr(bad, 7);
    END IF;
    due := COALESCE(run_at, statement_timestamp() + COALESCE(delay, interval '0'));
    IF start_by < greatest(due, statement_timestamp()) THEN
        -- Before the due time on the database clock: it could never start; unless
        -- the key exists (a producer's retry after its deadline passed).
        PERFORM FROM {{schema}}.delayq_outbox o WHERE o.queue = delayq_enqueue.queue AND o.task_id = delayq_enqueue.task_id;
        IF FOUND THEN
            duplicate := true;
            RETURN;
        END IF;
        RAISE USING ERRCODE = 'QD012', MESSAGE = format(
            'invalid task: start deadline: %s is before the task''s due time %s (its run-at, or now plus its delay on the database clock): it could never start',
            start_by, greatest(due, statement_timestamp()));
    END IF;
    soon := within = 0 OR due < statement_timestamp() + within * interval '1 millisecond';
    IF soon AND cooldown > 0 THEN
        -- The cooldown (outbox.Config.NotifyCooldown) with delayq_notifiers for the
        -- Client's memory: an enqueue less than the cooldown after a committed
        -- notifier leans on it (notify_late: migration 00015's trigger notifies at
        -- a late commit); from half-way, one enqueue at a time (the transaction
        -- advisory lock: tried, never waited for) notifies on purpose and records
        -- itself, so a committed notifier is at hand all along. Without a live
        -- notifier an enqueue notifies, and records itself if no one else is.
        SELECT clock_timestamp() - n.sent INTO age FROM {{schema}}.delayq_notifiers n WHERE n.queue = delayq_enqueue.queue;
        IF age < cooldown * interval '1 millisecond' THEN
            IF age >= cooldown * interval '500 microseconds'
               AND pg_try_advisory_xact_lock(hashtextextended('delayq_notifiers {{schema}}.' || queue, 0)) THEN
                renew := true;
            ELSE
                late := channel;
            END IF;
        ELSE
            renew := pg_try_advisory_xact_lock(hashtextextended('delayq_notifiers {{schema}}.' || queue, 0));
        END IF;
    END IF;
    INSERT INTO {{schema}}.delayq_outbox AS t (queue, task_id, run_at, payload, max_attempts, trace_context, start_by, priority, notify_late)
    VALUES (queue, task_id, due, COALESCE(payload, ''::bytea), COALESCE(NULLIF(max_attempts, 0), default_attempts),
            NULLIF(trace_context, ''), start_by, COALESCE(priority, 0), late)
    ON CONFLICT ON CONSTRAINT delayq_outbox_pkey DO NOTHING
    RETURNING t.run_at INTO due_at;
    IF NOT FOUND THEN
        duplicate := true;
        RETURN;
    END IF;
    duplicate := false;
    IF soon AND late IS NULL THEN
        PERFORM pg_notify(channel, queue);
        IF renew THEN
            INSERT INTO {{schema}}.delayq_notifiers AS n (queue, sent) VALUES (queue, clock_timestamp())
            ON CONFLICT ON CONSTRAINT delayq_notifiers_pkey DO UPDATE SET sent = excluded.sent;
        END IF;
    END IF;
END
$$;
-- +goose StatementEnd
