-- The transactional outbox of delayq. See docs/DESIGN.md, "The outbox".
--
-- {{schema}} is replaced with the configured schema (a plain lower-case identifier,
-- validated) before goose reads this file; run it through package migrations, not the
-- goose CLI.

-- +goose Up

-- Columns are ordered by physical layout, not by meaning: 8-byte fixed-width columns first,
-- then 4-byte ones, then variable-width ones, the usually-NULL ones last. Postgres pads
-- each column to its alignment, so this order wastes no byte of padding.
-- With a 20-byte payload a pending row takes about 120 B of heap, plus its primary-key and
-- pending-index entries: about 200 B in all (TestRowSize measures it; budget 300 B).
CREATE TABLE {{schema}}.delayq_outbox (
    -- Earliest execution time. Set from the database clock when the producer gave a delay.
    run_at       timestamptz NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- Attempts started so far, as last recorded by a worker.
    attempt      integer     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts integer     NOT NULL CHECK (max_attempts >= 1),
    -- Bumped by every reschedule. A worker's completion guard matches it, so a worker
    -- holding an older copy of the task cannot complete the rescheduled one.
    version      integer     NOT NULL DEFAULT 1 CHECK (version >= 1),
    -- The business identity: (queue, task_id) is the durable idempotency key.
    queue        text        NOT NULL,
    task_id      text        NOT NULL,
    -- pending (committed, not yet in Redis) -> queued (in Redis) -> done | dead | cancelled.
    state        text        NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'queued', 'done', 'dead', 'cancelled')),
    payload      bytea       NOT NULL,
    -- A short summary of the last failure (the producer library truncates it).
    last_error   text,
    -- When the relay put the row in Redis.
    queued_at    timestamptz,
    -- When the row reached a terminal state: done, dead or cancelled.
    done_at      timestamptz,
    CONSTRAINT delayq_outbox_pkey PRIMARY KEY (queue, task_id)
);

-- The relay's scan:
--   SELECT ... WHERE state = 'pending' AND run_at < $1 ORDER BY run_at LIMIT $2
--   FOR UPDATE SKIP LOCKED
-- is an index scan in run_at order on this index, which holds only the rows still waiting
-- for the relay, so it stays small however long the history grows (TestRelayScanUsesIndex
-- checks the plan with EXPLAIN).
CREATE INDEX delayq_outbox_pending_run_at_idx
    ON {{schema}}.delayq_outbox (run_at)
    WHERE state = 'pending';

-- The relay lists the queues with queued rows. (00002 keys it on the queue alone.)
CREATE INDEX delayq_outbox_queued_idx
    ON {{schema}}.delayq_outbox (queue, task_id)
    WHERE state = 'queued';

-- Retention deletes finished rows in batches: WHERE done_at < $1.
CREATE INDEX delayq_outbox_done_at_idx
    ON {{schema}}.delayq_outbox (done_at)
    WHERE done_at IS NOT NULL;

-- +goose Down

-- The schema itself is left in place: it may be the user's own.
DROP TABLE {{schema}}.delayq_outbox;
