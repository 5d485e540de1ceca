-- The concurrency key in the SQL API (issue 35 item 1, issue 34 item 1):
-- delayq_enqueue gains concurrency_key and delayq_enqueue_many concurrency_keys
-- (outbox.Task.ConcurrencyKey; docs/DESIGN.md, "The SQL API"). NULL or '' is none;
-- otherwise at most 200 bytes without control characters, as
-- validate.ConcurrencyKey, else SQLSTATE QD019 and nothing written. An insert
-- takes the key; a replace or debounce keeps the row's (as outbox.Client does).
--
-- A new parameter changes the functions' signatures, so each is dropped and
-- created again; calls by name or position keep working. The bodies are 00025's
-- and 00022's with the key added; Down restores those as they were.

-- +goose Up
DROP FUNCTION IF EXISTS {{schema}}.delayq_enqueue(text, text, bytea, interval, timestamptz, integer, integer, timestamptz, text, text, interval, interval);
DROP FUNCTION IF EXISTS {{schema}}.delayq_enqueue_many(text[], text[], bytea[], interval[], timestamptz[], integer[], integer[], timestamptz[], text[]);

-- +goose StatementBegin
CREATE FUNCTION {{schema}}.delayq_enqueue(
    queue text, task_id text, payload bytea DEFAULT NULL, delay interval DEFAULT NULL,
    run_at timestamptz DEFAULT NULL, max_attempts integer DEFAULT NULL, priority integer DEFAULT NULL,
    start_by timestamptz DEFAULT NULL, trace_context text DEFAULT NULL,
    on_conflict text DEFAULT NULL, debounce interval DEFAULT NULL, max_wait interval DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
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
    -- Read only where they are needed (a task due soon, a replace).
    cooldown integer;
    channel text;
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
    -- The task's rules as one expression (delayq_enqueue_many's), and only when it
    -- does not hold, delayq_task_error's message: PL/pgSQL prepares each
    -- expression it evaluates once per transaction, and a valid task would
    -- otherwise pay for every rule of delayq_task_error in every transaction.
    IF (octet_length(queue) BETWEEN 1 AND 64 AND queue COLLATE "C" ~ '^[A-Za-z0-9_.-]+$'
        AND octet_length(task_id) BETWEEN 1 AND 200 AND task_id COLLATE "C" ~ '^[!-z|~]+$'
        AND (delay IS NULL OR delay BETWEEN interval '0' AND interval '106751 days 23:47:16.854775')
        AND (run_at IS NULL OR run_at > 'epoch'::timestamptz AND run_at < '10000-01-01 00:00:00+00'::timestamptz
             AND (delay IS NULL OR delay = interval '0'))
        AND (start_by IS NULL OR start_by > 'epoch'::timestamptz
             AND start_by < 'epoch'::timestamptz + interval '100000000000.001 seconds' AND (run_at IS NULL OR start_by >= run_at))
        AND (payload IS NULL OR octet_length(payload) <= max_payload)
        AND (max_attempts IS NULL OR max_attempts BETWEEN 0 AND 1000000)
        AND (trace_context IS NULL OR octet_length(trace_context) <= 512 AND trace_context COLLATE "C" ~ '^[ -~]*$')
        AND (priority IS NULL OR priority BETWEEN 0 AND 9)
        AND (concurrency_key IS NULL OR octet_length(concurrency_key) <= 200
             AND concurrency_key !~ '[\u0001-\u001f\u007f-\u009f]')) IS NOT TRUE THEN
        bad := {{schema}}.delayq_task_error(queue, task_id, octet_length(payload), delay, run_at,
            max_attempts, priority, start_by, trace_context, max_payload, default_attempts);
        IF bad IS NOT NULL THEN
            RAISE USING ERRCODE = left(bad, 5), MESSAGE = substr(bad, 7);
        END IF;
        -- The concurrency key, checked as validate.ConcurrencyKey.
        IF octet_length(concurrency_key) > 200 THEN
            RAISE USING ERRCODE = 'QD019', MESSAGE = format('invalid task: concurrency key: %s bytes: at most 200', octet_length(concurrency_key));
        ELSIF concurrency_key ~ '[\u0001-\u001f\u007f-\u009f]' THEN
            RAISE USING ERRCODE = 'QD019', MESSAGE = 'invalid task: concurrency key: a control character';
        END IF;
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
        INSERT INTO {{schema}}.delayq_outbox AS t (queue, task_id, run_at, payload, max_attempts, trace_context, priority, concurrency_key)
        VALUES (queue, task_id,
                CASE WHEN mode = 3 THEN CASE WHEN max_wait IS NOT NULL THEN least(statement_timestamp() + debounce, now() + max_wait)
                                             ELSE statement_timestamp() + debounce END
                     ELSE COALESCE(run_at, statement_timestamp() + COALESCE(delay, interval '0')) END,
                COALESCE(payload, ''::bytea), COALESCE(NULLIF(max_attempts, 0), default_attempts),
                NULLIF(trace_context, ''), COALESCE(priority, 0), NULLIF(concurrency_key, '')) -- '' is none
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
            channel := CASE WHEN current_setting('delayq.notify_channel', true) IS NULL THEN 'delayq_outbox'
                ELSE {{schema}}.delayq_channel() END;
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
    IF soon THEN
        cooldown := CASE WHEN current_setting('delayq.notify_cooldown_ms', true) IS NULL THEN 25
            ELSE {{schema}}.delayq_setting('notify_cooldown_ms', 25, 1, 2147483647, 0) END;
        channel := CASE WHEN current_setting('delayq.notify_channel', true) IS NULL THEN 'delayq_outbox'
            ELSE {{schema}}.delayq_channel() END;
        IF cooldown > 0 THEN
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
    END IF;
    -- The outputs in the RETURNING: each expression of PL/pgSQL's costs a
    -- preparation per transaction.
    INSERT INTO {{schema}}.delayq_outbox AS t (queue, task_id, run_at, payload, max_attempts, trace_context, start_by, priority, concurrency_key, notify_late)
    VALUES (queue, task_id, due, COALESCE(payload, ''::bytea), COALESCE(NULLIF(max_attempts, 0), default_attempts),
            NULLIF(trace_context, ''), start_by, COALESCE(priority, 0), NULLIF(concurrency_key, ''), late)
    ON CONFLICT ON CONSTRAINT delayq_outbox_pkey DO NOTHING
    RETURNING t.run_at, false, 'inserted' INTO due_at, duplicate, outcome;
    IF NOT FOUND THEN
        duplicate := true;
        outcome := 'duplicate';
        RETURN;
    END IF;
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

-- +goose StatementBegin
CREATE FUNCTION {{schema}}.delayq_enqueue_many(
    queues text[], task_ids text[], payloads bytea[] DEFAULT NULL, delays interval[] DEFAULT NULL,
    run_ats timestamptz[] DEFAULT NULL, max_attempts integer[] DEFAULT NULL, priorities integer[] DEFAULT NULL,
    start_bys timestamptz[] DEFAULT NULL, trace_contexts text[] DEFAULT NULL, concurrency_keys text[] DEFAULT NULL)
RETURNS TABLE (ord integer, duplicate boolean, due_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    max_payload integer := {{schema}}.delayq_setting('max_payload_bytes', 65536, 1, 16777216, 16777216);
    default_attempts integer := {{schema}}.delayq_setting('default_max_attempts', 25, 1, 1000000, NULL);
    within integer := {{schema}}.delayq_setting('notify_within_ms', 30000, 1, 2147483647, 0);
    channel text := {{schema}}.delayq_channel();
    n integer := cardinality(task_ids);
    bad record;
    err text;
    ins_q text[];
    ins_id text[];
    ins_at timestamptz[];
BEGIN
    IF queues IS NULL OR task_ids IS NULL OR cardinality(queues) <> n
       OR cardinality(payloads) <> n OR cardinality(delays) <> n OR cardinality(run_ats) <> n
       OR cardinality(max_attempts) <> n OR cardinality(priorities) <> n OR cardinality(start_bys) <> n
       OR cardinality(trace_contexts) <> n OR cardinality(concurrency_keys) <> n
       OR array_ndims(queues) > 1 OR array_ndims(task_ids) > 1 THEN
        RAISE USING ERRCODE = 'QD016', MESSAGE = format(
            'invalid arguments: queues and task_ids are required, every array has one element per task (%s task ids)', n);
    END IF;
    -- The first invalid task: delayq_task_error's rules as one expression, evaluated
    -- by the executor (a PL/pgSQL call a task cost a tenth of the batch), then that
    -- task's error from delayq_task_error. TestRefusedByBoth holds the two together.
    SELECT k.i, k.q, k.id, k.p, k.d, k.r, k.m, k.y, k.s, k.c, k.k INTO bad
    FROM unnest(queues, task_ids, payloads, delays, run_ats, max_attempts, priorities, start_bys, trace_contexts, concurrency_keys)
         WITH ORDINALITY AS k(q, id, p, d, r, m, y, s, c, k, i)
    WHERE (octet_length(k.q) BETWEEN 1 AND 64 AND k.q COLLATE "C" ~ '^[A-Za-z0-9_.-]+$'
           AND octet_length(k.id) BETWEEN 1 AND 200 AND k.id COLLATE "C" ~ '^[!-z|~]+$'
           AND (k.d IS NULL OR k.d BETWEEN interval '0' AND interval '106751 days 23:47:16.854775')
           AND (k.r IS NULL OR k.r > 'epoch'::timestamptz AND k.r < '10000-01-01 00:00:00+00'::timestamptz
                AND (k.d IS NULL OR k.d = interval '0'))
           AND (k.s IS NULL OR k.s > 'epoch'::timestamptz
                AND k.s < 'epoch'::timestamptz + interval '100000000000.001 seconds' AND (k.r IS NULL OR k.s >= k.r))
           AND (k.p IS NULL OR octet_length(k.p) <= max_payload)
           AND (k.m IS NULL OR k.m BETWEEN 0 AND 1000000)
           AND (k.c IS NULL OR octet_length(k.c) <= 512 AND k.c COLLATE "C" ~ '^[ -~]*$')
           AND (k.y IS NULL OR k.y BETWEEN 0 AND 9)
           AND (k.k IS NULL OR octet_length(k.k) <= 200 AND k.k !~ '[\u0001-\u001f\u007f-\u009f]')) IS NOT TRUE
    ORDER BY k.i
    LIMIT 1;
    IF FOUND THEN
        err := {{schema}}.delayq_task_error(bad.q, bad.id, octet_length(bad.p), bad.d, bad.r, bad.m, bad.y, bad.s, bad.c,
            max_payload, default_attempts);
        -- Valid but for its concurrency key, checked as validate.ConcurrencyKey.
        err := COALESCE(err, CASE WHEN octet_length(bad.k) > 200
            THEN format('QD019 invalid task: concurrency key: %s bytes: at most 200', octet_length(bad.k))
            ELSE 'QD019 invalid task: concurrency key: a control character' END);
        RAISE USING ERRCODE = left(err, 5), MESSAGE = format('task %s of %s (%s/%s): %s; nothing was inserted', bad.i, n, bad.q, bad.id, substr(err, 7));
    END IF;
    -- A start deadline before its due time refuses the batch (a key that exists is a
    -- duplicate); a batch without deadlines (most) skips the scan.
    IF cardinality(array_remove(start_bys, NULL)) > 0 THEN
        SELECT k.i, k.q, k.id, k.s, greatest(COALESCE(k.r, statement_timestamp() + COALESCE(k.d, interval '0')), statement_timestamp()) AS due INTO bad
        FROM unnest(queues, task_ids, run_ats, delays, start_bys) WITH ORDINALITY AS k(q, id, r, d, s, i)
        WHERE k.s < greatest(COALESCE(k.r, statement_timestamp() + COALESCE(k.d, interval '0')), statement_timestamp())
          AND NOT EXISTS (SELECT FROM {{schema}}.delayq_outbox o WHERE o.queue = k.q AND o.task_id = k.id)
        ORDER BY k.i
        LIMIT 1;
        IF FOUND THEN
            RAISE USING ERRCODE = 'QD012', MESSAGE = format(
                'task %s of %s (%s/%s): invalid task: start deadline: %s is before the task''s due time %s: it could never start; nothing was inserted',
                bad.i, n, bad.q, bad.id, bad.s, bad.due);
        END IF;
    END IF;
    WITH ins AS (
        INSERT INTO {{schema}}.delayq_outbox AS t (queue, task_id, run_at, payload, max_attempts, trace_context, start_by, priority, concurrency_key)
        SELECT u.q, u.id, COALESCE(u.r, statement_timestamp() + COALESCE(u.d, interval '0')), COALESCE(u.p, ''::bytea),
               COALESCE(NULLIF(u.m, 0), default_attempts), NULLIF(u.c, ''), u.s, COALESCE(u.y, 0), NULLIF(u.k, '')
        FROM (SELECT DISTINCT ON (k.q COLLATE "C", k.id COLLATE "C") k.*
              FROM unnest(queues, task_ids, payloads, delays, run_ats, max_attempts, priorities, start_bys, trace_contexts, concurrency_keys)
                   WITH ORDINALITY AS k(q, id, p, d, r, m, y, s, c, k, i)
              ORDER BY k.q COLLATE "C", k.id COLLATE "C", k.i) AS u
        ON CONFLICT ON CONSTRAINT delayq_outbox_pkey DO NOTHING
        RETURNING t.queue, t.task_id, t.run_at
    )
    SELECT array_agg(ins.queue), array_agg(ins.task_id), array_agg(ins.run_at) INTO ins_q, ins_id, ins_at FROM ins;
    PERFORM pg_notify(channel, d.q)
    FROM (SELECT DISTINCT x.q FROM unnest(ins_q, ins_at) AS x(q, ra)
          WHERE within = 0 OR x.ra < statement_timestamp() + within * interval '1 millisecond') AS d;
    IF cardinality(ins_q) = n THEN
        -- Every task inserted (the common case): each one's run_at is its own, no join.
        RETURN QUERY
        SELECT k.i::integer, false, COALESCE(k.r, statement_timestamp() + COALESCE(k.d, interval '0'))
        FROM unnest(task_ids, run_ats, delays) WITH ORDINALITY AS k(id, r, d, i)
        ORDER BY k.i;
        RETURN;
    END IF;
    -- Duplicates: a task is inserted if it is its key's first (the lowest position)
    -- and the key is among the rows inserted.
    RETURN QUERY
    SELECT k.i::integer, x.ra IS NULL, x.ra
    FROM unnest(queues, task_ids) WITH ORDINALITY AS k(q, id, i)
    LEFT JOIN (SELECT f.first, y.ra
               FROM (SELECT u.q, u.id, min(u.i) AS first FROM unnest(queues, task_ids) WITH ORDINALITY AS u(q, id, i)
                     GROUP BY u.q, u.id) AS f
               JOIN unnest(ins_q, ins_id, ins_at) AS y(q, id, ra) ON y.q = f.q AND y.id = f.id) AS x ON x.first = k.i
    ORDER BY k.i;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS {{schema}}.delayq_enqueue(text, text, bytea, interval, timestamptz, integer, integer, timestamptz, text, text, interval, interval, text);
DROP FUNCTION IF EXISTS {{schema}}.delayq_enqueue_many(text[], text[], bytea[], interval[], timestamptz[], integer[], integer[], timestamptz[], text[], text[]);
-- 00025's delayq_enqueue and 00022's delayq_enqueue_many, as they were.
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

-- +goose StatementBegin
CREATE FUNCTION {{schema}}.delayq_enqueue_many(
    queues text[], task_ids text[], payloads bytea[] DEFAULT NULL, delays interval[] DEFAULT NULL,
    run_ats timestamptz[] DEFAULT NULL, max_attempts integer[] DEFAULT NULL, priorities integer[] DEFAULT NULL,
    start_bys timestamptz[] DEFAULT NULL, trace_contexts text[] DEFAULT NULL)
RETURNS TABLE (ord integer, duplicate boolean, due_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    max_payload integer := {{schema}}.delayq_setting('max_payload_bytes', 65536, 1, 16777216, 16777216);
    default_attempts integer := {{schema}}.delayq_setting('default_max_attempts', 25, 1, 1000000, NULL);
    within integer := {{schema}}.delayq_setting('notify_within_ms', 30000, 1, 2147483647, 0);
    channel text := {{schema}}.delayq_channel();
    n integer := cardinality(task_ids);
    bad record;
    err text;
    ins_q text[];
    ins_id text[];
    ins_at timestamptz[];
BEGIN
    IF queues IS NULL OR task_ids IS NULL OR cardinality(queues) <> n
       OR cardinality(payloads) <> n OR cardinality(delays) <> n OR cardinality(run_ats) <> n
       OR cardinality(max_attempts) <> n OR cardinality(priorities) <> n OR cardinality(start_bys) <> n
       OR cardinality(trace_contexts) <> n
       OR array_ndims(queues) > 1 OR array_ndims(task_ids) > 1 THEN
        RAISE USING ERRCODE = 'QD016', MESSAGE = format(
            'invalid arguments: queues and task_ids are required, every array has one element per task (%s task ids)', n);
    END IF;
    -- The first invalid task: delayq_task_error's rules as one expression, evaluated
    -- by the executor (a PL/pgSQL call a task cost a tenth of the batch), then that
    -- task's error from delayq_task_error. TestRefusedByBoth holds the two together.
    SELECT k.i, k.q, k.id, k.p, k.d, k.r, k.m, k.y, k.s, k.c INTO bad
    FROM unnest(queues, task_ids, payloads, delays, run_ats, max_attempts, priorities, start_bys, trace_contexts)
         WITH ORDINALITY AS k(q, id, p, d, r, m, y, s, c, i)
    WHERE (octet_length(k.q) BETWEEN 1 AND 64 AND k.q COLLATE "C" ~ '^[A-Za-z0-9_.-]+$'
           AND octet_length(k.id) BETWEEN 1 AND 200 AND k.id COLLATE "C" ~ '^[!-z|~]+$'
           AND (k.d IS NULL OR k.d BETWEEN interval '0' AND interval '106751 days 23:47:16.854775')
           AND (k.r IS NULL OR k.r > 'epoch'::timestamptz AND k.r < '10000-01-01 00:00:00+00'::timestamptz
                AND (k.d IS NULL OR k.d = interval '0'))
           AND (k.s IS NULL OR k.s > 'epoch'::timestamptz
                AND k.s < 'epoch'::timestamptz + interval '100000000000.001 seconds' AND (k.r IS NULL OR k.s >= k.r))
           AND (k.p IS NULL OR octet_length(k.p) <= max_payload)
           AND (k.m IS NULL OR k.m BETWEEN 0 AND 1000000)
           AND (k.c IS NULL OR octet_length(k.c) <= 512 AND k.c COLLATE "C" ~ '^[ -~]*$')
           AND (k.y IS NULL OR k.y BETWEEN 0 AND 9)) IS NOT TRUE
    ORDER BY k.i
    LIMIT 1;
    IF FOUND THEN
        err := {{schema}}.delayq_task_error(bad.q, bad.id, octet_length(bad.p), bad.d, bad.r, bad.m, bad.y, bad.s, bad.c,
            max_payload, default_attempts);
        RAISE USING ERRCODE = left(err, 5), MESSAGE = format('task %s of %s (%s/%s): %s; nothing was inserted', bad.i, n, bad.q, bad.id, substr(err, 7));
    END IF;
    -- A start deadline before its due time refuses the batch (a key that exists is a
    -- duplicate); a batch without deadlines (most) skips the scan.
    IF cardinality(array_remove(start_bys, NULL)) > 0 THEN
        SELECT k.i, k.q, k.id, k.s, greatest(COALESCE(k.r, statement_timestamp() + COALESCE(k.d, interval '0')), statement_timestamp()) AS due INTO bad
        FROM unnest(queues, task_ids, run_ats, delays, start_bys) WITH ORDINALITY AS k(q, id, r, d, s, i)
        WHERE k.s < greatest(COALESCE(k.r, statement_timestamp() + COALESCE(k.d, interval '0')), statement_timestamp())
          AND NOT EXISTS (SELECT FROM {{schema}}.delayq_outbox o WHERE o.queue = k.q AND o.task_id = k.id)
        ORDER BY k.i
        LIMIT 1;
        IF FOUND THEN
            RAISE USING ERRCODE = 'QD012', MESSAGE = format(
                'task %s of %s (%s/%s): invalid task: start deadline: %s is before the task''s due time %s: it could never start; nothing was inserted',
                bad.i, n, bad.q, bad.id, bad.s, bad.due);
        END IF;
    END IF;
    WITH ins AS (
        INSERT INTO {{schema}}.delayq_outbox AS t (queue, task_id, run_at, payload, max_attempts, trace_context, start_by, priority)
        SELECT u.q, u.id, COALESCE(u.r, statement_timestamp() + COALESCE(u.d, interval '0')), COALESCE(u.p, ''::bytea),
               COALESCE(NULLIF(u.m, 0), default_attempts), NULLIF(u.c, ''), u.s, COALESCE(u.y, 0)
        FROM (SELECT DISTINCT ON (k.q COLLATE "C", k.id COLLATE "C") k.*
              FROM unnest(queues, task_ids, payloads, delays, run_ats, max_attempts, priorities, start_bys, trace_contexts)
                   WITH ORDINALITY AS k(q, id, p, d, r, m, y, s, c, i)
              ORDER BY k.q COLLATE "C", k.id COLLATE "C", k.i) AS u
        ON CONFLICT ON CONSTRAINT delayq_outbox_pkey DO NOTHING
        RETURNING t.queue, t.task_id, t.run_at
    )
    SELECT array_agg(ins.queue), array_agg(ins.task_id), array_agg(ins.run_at) INTO ins_q, ins_id, ins_at FROM ins;
    PERFORM pg_notify(channel, d.q)
    FROM (SELECT DISTINCT x.q FROM unnest(ins_q, ins_at) AS x(q, ra)
          WHERE within = 0 OR x.ra < statement_timestamp() + within * interval '1 millisecond') AS d;
    IF cardinality(ins_q) = n THEN
        -- Every task inserted (the common case): each one's run_at is its own, no join.
        RETURN QUERY
        SELECT k.i::integer, false, COALESCE(k.r, statement_timestamp() + COALESCE(k.d, interval '0'))
        FROM unnest(task_ids, run_ats, delays) WITH ORDINALITY AS k(id, r, d, i)
        ORDER BY k.i;
        RETURN;
    END IF;
    -- Duplicates: a task is inserted if it is its key's first (the lowest position)
    -- and the key is among the rows inserted.
    RETURN QUERY
    SELECT k.i::integer, x.ra IS NULL, x.ra
    FROM unnest(queues, task_ids) WITH ORDINALITY AS k(q, id, i)
    LEFT JOIN (SELECT f.first, y.ra
               FROM (SELECT u.q, u.id, min(u.i) AS first FROM unnest(queues, task_ids) WITH ORDINALITY AS u(q, id, i)
                     GROUP BY u.q, u.id) AS f
               JOIN unnest(ins_q, ins_id, ins_at) AS y(q, id, ra) ON y.q = f.q AND y.id = f.id) AS x ON x.first = k.i
    ORDER BY k.i;
END
$$;
-- +goose StatementEnd
