-- The SQL API of the outbox (issue 35): enqueue, enqueue many, cancel and reschedule
-- as functions, so that a service in any language enqueues inside its own
-- transaction with the rules of outbox.Client (docs/DESIGN.md, "The SQL API"):
-- the same validation and limits (internal/validate), the run time of a delay on
-- the database clock (statement_timestamp() + delay), the same row, and the same
-- notification rules (a task due within NotifyWithin notifies at commit unless an
-- enqueue into the same queue notified less than NotifyCooldown before and has
-- committed; then notify_late, migration 00015). Invalid input
-- raises an error whose SQLSTATE (class QD) and message a caller branches on:
--
--   QD001 invalid queue name        QD002 invalid task id       QD003 payload too large
--   QD010 invalid delay             QD011 invalid run-at time   QD012 invalid start deadline
--   QD013 invalid max attempts      QD014 invalid trace context QD015 invalid priority
--   QD016 invalid arguments (arrays of unequal lengths)
--   QD020 task not found            QD021 task already finished
--   QD030 invalid setting (a delayq.* setting below)
--   40001 the task changed concurrently (cancel, reschedule): try again
--
-- A duplicate (queue, task_id) is not an error: duplicate is true, nothing written.
--
-- The options of outbox.Config come from settings, unset meaning Config's default
-- (ALTER ROLE ... SET delayq.notify_channel = 'x', or SET in a session):
-- delayq.max_payload_bytes (65536; -1: 16 MiB), delayq.default_max_attempts (25),
-- delayq.notify_channel ('delayq_outbox'), delayq.notify_within_ms (30000; -1:
-- every task), delayq.notify_cooldown_ms (25; -1: off), delayq.clear_payload_on_done
-- (off). The cooldown's memory is the table delayq_notifiers, below.
--
-- Every function runs with the caller's rights (SECURITY INVOKER): the role needs
-- the outbox's INSERT, SELECT and UPDATE, as the Go client does, and
-- delayq_notifiers' INSERT, SELECT and UPDATE.

-- +goose Up

-- delayq_notifiers is the cooldown's memory, shared by every session: per queue,
-- when the last recorded enqueue that notified was sent (clock_timestamp()). It is
-- written in that enqueue's transaction, so the others see it only once that
-- transaction committed, that is once its notification reached the relay; a
-- rollback (of a savepoint too) takes it back. Unlogged: it is a hint, no WAL is
-- written for it, and a crash empties it (the next enqueues notify).
CREATE UNLOGGED TABLE IF NOT EXISTS {{schema}}.delayq_notifiers (
    queue text PRIMARY KEY,
    sent  timestamptz NOT NULL
);

-- delayq_setting is the integer setting delayq.<name>: fallback when unset, minus1
-- for -1 when minus1 is not NULL, else lo..hi; QD030 otherwise.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_setting(name text, fallback integer, lo integer, hi integer, minus1 integer)
RETURNS integer LANGUAGE plpgsql STABLE AS $$
DECLARE
    v text := current_setting('delayq.' || name, true);
    n integer;
BEGIN
    IF v IS NULL OR v = '' THEN
        RETURN fallback;
    END IF;
    IF v ~ '^-?[0-9]{1,9}$' THEN
        n := v::integer;
        IF n = -1 AND minus1 IS NOT NULL THEN
            RETURN minus1;
        END IF;
        IF n BETWEEN lo AND hi THEN
            RETURN n;
        END IF;
    END IF;
    RAISE USING ERRCODE = 'QD030', MESSAGE = format('invalid outbox config: delayq.%s %L: %s..%s%s', name, v, lo, hi,
        CASE WHEN minus1 IS NOT NULL THEN ', or -1' ELSE '' END);
END
$$;
-- +goose StatementEnd

-- delayq_channel is the setting delayq.notify_channel: 1..63 bytes of [a-z0-9_].
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_channel() RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    v text := current_setting('delayq.notify_channel', true);
BEGIN
    IF v IS NULL OR v = '' THEN
        RETURN 'delayq_outbox';
    END IF;
    IF v COLLATE "C" ~ '^[a-z0-9_]{1,63}$' THEN
        RETURN v;
    END IF;
    RAISE USING ERRCODE = 'QD030', MESSAGE = format('invalid outbox config: delayq.notify_channel %L must be 1..63 bytes of [a-z0-9_]', v);
END
$$;
-- +goose StatementEnd

-- delayq_task_error checks a task as outbox.Client.Validate does, in its order: the
-- SQLSTATE of the first rule broken, a space and its message; NULL when the task is
-- valid. A NULL field is an unset one (payload_bytes NULL: no payload). It returns a
-- scalar so that callers evaluate it as a plain PL/pgSQL expression (no query).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_task_error(
    queue text, task_id text, payload_bytes integer, delay interval, run_at timestamptz,
    max_attempts integer, priority integer, start_by timestamptz, trace_context text,
    max_payload_bytes integer, default_max_attempts integer)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    code text;
    message text;
BEGIN
    IF queue IS NULL OR queue = '' THEN
        code := 'QD001'; message := 'invalid queue name: empty';
    ELSIF octet_length(queue) > 64 THEN
        code := 'QD001'; message := format('invalid queue name: %s bytes, at most 64', octet_length(queue));
    ELSIF queue COLLATE "C" !~ '^[A-Za-z0-9_.-]+$' THEN
        code := 'QD001'; message := format('invalid queue name: %s: allowed are letters, digits, ''_'', ''.'', ''-''', to_json(queue));
    ELSIF task_id IS NULL OR task_id = '' THEN
        code := 'QD002'; message := 'invalid task id: empty';
    ELSIF octet_length(task_id) > 200 THEN
        code := 'QD002'; message := format('invalid task id: %s bytes, at most 200', octet_length(task_id));
    ELSIF task_id COLLATE "C" !~ '^[!-z|~]+$' THEN
        code := 'QD002'; message := format('invalid task id: %s: allowed is printable ASCII except space, ''{'' and ''}''', to_json(left(task_id, 64)));
    ELSIF delay < interval '0' THEN
        code := 'QD010'; message := format('invalid task: delay: %s is negative', delay);
    ELSIF delay > interval '106751 days 23:47:16.854775' THEN
        code := 'QD010'; message := format('invalid task: delay: %s is longer than 292 years (a Go time.Duration)', delay);
    ELSIF run_at IS NOT NULL AND delay IS NOT NULL AND delay <> interval '0' THEN
        code := 'QD011'; message := format('invalid task: run-at time: both delay (%s) and run_at (%s) are set; set one', delay, run_at);
    ELSIF run_at <= 'epoch'::timestamptz THEN
        code := 'QD011'; message := format('invalid task: run-at time: %s is at or before the Unix epoch (an unset timestamp?)', run_at);
    ELSIF run_at >= '10000-01-01 00:00:00+00'::timestamptz THEN
        code := 'QD011'; message := format('invalid task: run-at time: %s is after the year 9999', run_at);
    ELSIF start_by <= 'epoch'::timestamptz OR start_by >= 'epoch'::timestamptz + interval '100000000000.001 seconds' THEN
        code := 'QD012'; message := format('invalid task: start deadline: %s is out of range', start_by);
    ELSIF start_by < run_at THEN
        code := 'QD012'; message := format('invalid task: start deadline: %s is before run_at %s: the task could never start', start_by, run_at);
    ELSIF payload_bytes > max_payload_bytes THEN
        code := 'QD003'; message := format('payload too large: %s bytes, at most %s (delayq.max_payload_bytes)', payload_bytes, max_payload_bytes);
    ELSIF max_attempts < 0 OR max_attempts > 1000000 THEN
        code := 'QD013'; message := format('invalid task: max attempts: %s: 1..1000000 (0 or NULL means the default, %s)', max_attempts, default_max_attempts);
    ELSIF octet_length(trace_context) > 512 THEN
        code := 'QD014'; message := format('invalid task: trace context: %s bytes, at most 512', octet_length(trace_context));
    ELSIF trace_context COLLATE "C" !~ '^[ -~]*$' THEN
        code := 'QD014'; message := 'invalid task: trace context: printable ASCII only';
    ELSIF priority < 0 OR priority > 9 THEN
        code := 'QD015'; message := format('invalid task: priority: %s: 0..9 (higher runs first; 0 is the default)', priority);
    END IF;
    RETURN code || ' ' || message;
END
$$;
-- +goose StatementEnd

-- delayq_enqueue is outbox.Client.Enqueue: one task, in the caller's transaction.
-- Set delay or run_at (neither: now). Returns duplicate (nothing written: the key
-- exists) and due_at, the stored run_at (NULL for a duplicate).
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

-- delayq_enqueue_many is outbox.Client.EnqueueMany: arrays of one element per task
-- (queues and task_ids required, the others NULL or of the same length, a NULL
-- element meaning unset). Every task is checked first: the first invalid one is
-- raised, naming its position (1-based), and nothing is written. The rows are
-- inserted in key order (COLLATE "C"), so that two batches with common keys wait
-- for each other instead of deadlocking; a key given twice is a duplicate after
-- its first. Returns one row per task, in order: ord, duplicate, due_at. The relay
-- is notified once per queue at commit (no cooldown, as the Go call).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_enqueue_many(
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

-- delayq_explain raises why a guarded update of queue/task_id changed no row.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_explain(op text, queue text, task_id text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    st text;
BEGIN
    SELECT o.state INTO st FROM {{schema}}.delayq_outbox o WHERE o.queue = delayq_explain.queue AND o.task_id = delayq_explain.task_id;
    IF NOT FOUND THEN
        RAISE USING ERRCODE = 'QD020', MESSAGE = format('%s %s/%s: task not found', op, queue, task_id);
    ELSIF st IN ('pending', 'queued', 'waiting') THEN
        RAISE USING ERRCODE = '40001', MESSAGE = format('%s %s/%s: the task changed concurrently; try again', op, queue, task_id);
    END IF;
    RAISE USING ERRCODE = 'QD021', MESSAGE = format('%s %s/%s: task already finished (state %s)', op, queue, task_id, st);
END
$$;
-- +goose StatementEnd

-- delayq_cancel is outbox.Client.Cancel: a pending, queued or waiting task becomes
-- cancelled; QD020 when there is no such task, QD021 when it finished already.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_cancel(queue text, task_id text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    bad text;
BEGIN
    bad := {{schema}}.delayq_task_error(queue, task_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
    IF bad IS NOT NULL THEN
        RAISE USING ERRCODE = left(bad, 5), MESSAGE = substr(bad, 7);
    END IF;
    UPDATE {{schema}}.delayq_outbox o
    SET state = 'cancelled', done_at = statement_timestamp(),
        payload = CASE WHEN current_setting('delayq.clear_payload_on_done', true) IN ('on', 'true', '1') THEN ''::bytea ELSE o.payload END
    WHERE o.queue = delayq_cancel.queue AND o.task_id = delayq_cancel.task_id AND o.state IN ('pending', 'queued', 'waiting');
    IF NOT FOUND THEN
        PERFORM {{schema}}.delayq_explain('cancel', queue, task_id);
    END IF;
END
$$;
-- +goose StatementEnd

-- delayq_reschedule is outbox.Client.Reschedule: a pending or queued task moves to
-- run_at as a new version, which it returns (a waiting one keeps waiting); the relay is notified at commit when
-- the task is due within NotifyWithin or its older version is in Redis. QD011 for a
-- bad run_at, QD012 when the task's start deadline comes before it, QD020, QD021.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION {{schema}}.delayq_reschedule(queue text, task_id text, run_at timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    within integer := {{schema}}.delayq_setting('notify_within_ms', 30000, 1, 2147483647, 0);
    channel text := {{schema}}.delayq_channel();
    bad text;
    v integer;
    queued timestamptz;
    sb timestamptz;
    st text;
BEGIN
    bad := {{schema}}.delayq_task_error(queue, task_id, NULL, NULL, COALESCE(run_at, 'epoch'::timestamptz),
        NULL, NULL, NULL, NULL, NULL, NULL);
    IF bad IS NOT NULL THEN
        RAISE USING ERRCODE = left(bad, 5), MESSAGE = format('reschedule %s/%s: %s', queue, task_id, substr(bad, 7));
    END IF;
    UPDATE {{schema}}.delayq_outbox o
    SET run_at = delayq_reschedule.run_at, state = CASE WHEN o.state = 'waiting' THEN 'waiting' ELSE 'pending' END,
        version = o.version + 1
    WHERE o.queue = delayq_reschedule.queue AND o.task_id = delayq_reschedule.task_id AND o.state IN ('pending', 'queued', 'waiting')
      AND (o.start_by IS NULL OR o.start_by >= greatest(delayq_reschedule.run_at, statement_timestamp()))
    RETURNING o.version, o.queued_at, o.state INTO v, queued, st;
    IF FOUND THEN
        IF st = 'pending' AND (queued IS NOT NULL OR within = 0 OR run_at < statement_timestamp() + within * interval '1 millisecond') THEN
            PERFORM pg_notify(channel, queue);
        END IF;
        RETURN v;
    END IF;
    SELECT o.start_by INTO sb FROM {{schema}}.delayq_outbox o
    WHERE o.queue = delayq_reschedule.queue AND o.task_id = delayq_reschedule.task_id AND o.state IN ('pending', 'queued', 'waiting');
    IF sb < greatest(run_at, statement_timestamp()) THEN
        RAISE USING ERRCODE = 'QD012', MESSAGE = format(
            'reschedule %s/%s: invalid task: start deadline: the task''s deadline %s is before the new run time %s: it could never start; nothing changed',
            queue, task_id, sb, run_at);
    END IF;
    PERFORM {{schema}}.delayq_explain('reschedule', queue, task_id);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS {{schema}}.delayq_reschedule(text, text, timestamptz);
DROP FUNCTION IF EXISTS {{schema}}.delayq_cancel(text, text);
DROP FUNCTION IF EXISTS {{schema}}.delayq_explain(text, text, text);
DROP FUNCTION IF EXISTS {{schema}}.delayq_enqueue_many(text[], text[], bytea[], interval[], timestamptz[], integer[], integer[], timestamptz[], text[]);
DROP FUNCTION IF EXISTS {{schema}}.delayq_enqueue(text, text, bytea, interval, timestamptz, integer, integer, timestamptz, text);
DROP FUNCTION IF EXISTS {{schema}}.delayq_task_error(text, text, integer, interval, timestamptz, integer, integer, timestamptz, text, integer, integer);
DROP FUNCTION IF EXISTS {{schema}}.delayq_channel();
DROP FUNCTION IF EXISTS {{schema}}.delayq_setting(text, integer, integer, integer, integer);
DROP TABLE IF EXISTS {{schema}}.delayq_notifiers;
