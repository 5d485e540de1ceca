-- Concurrency keys and throttles (docs/DESIGN.md, "Concurrency keys and throttles").
--
-- delayq_outbox.concurrency_key (outbox.Task.ConcurrencyKey): the key a task counts
-- against (a tenant, an account), NULL for none. The relay carries it into the Redis
-- task hash (field k, only when set); repairs restore it from here.
--
-- delayq_queues.key_concurrency, key_throttle, key_window_ms: a queue's cap on the
-- runs of one key at once (0: none) and its throttle, at most key_throttle starts
-- of one key in any key_window_ms (0: none). Controls like the pause and the rate
-- limit: versioned, mirrored into Redis by the control operations and the relay's
-- sync, so a Redis that lost them gets them back.
--
-- Catalog changes only: a nullable column, and NOT NULL columns with constant
-- defaults (Postgres 11+). The outbox's CHECK is added NOT VALID, then validated
-- in its own step under a lock that lets writes go on. Each step can be run again.

-- +goose NO TRANSACTION

-- +goose Up
ALTER TABLE {{schema}}.delayq_outbox ADD COLUMN IF NOT EXISTS concurrency_key text;
ALTER TABLE {{schema}}.delayq_outbox DROP CONSTRAINT IF EXISTS delayq_outbox_concurrency_key_check;
ALTER TABLE {{schema}}.delayq_outbox ADD CONSTRAINT delayq_outbox_concurrency_key_check
    CHECK (octet_length(concurrency_key) BETWEEN 1 AND 200) NOT VALID;
ALTER TABLE {{schema}}.delayq_outbox VALIDATE CONSTRAINT delayq_outbox_concurrency_key_check;
ALTER TABLE {{schema}}.delayq_queues
    ADD COLUMN IF NOT EXISTS key_concurrency integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS key_throttle integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS key_window_ms bigint NOT NULL DEFAULT 1000;

-- +goose Down
ALTER TABLE {{schema}}.delayq_queues
    DROP COLUMN IF EXISTS key_concurrency,
    DROP COLUMN IF EXISTS key_throttle,
    DROP COLUMN IF EXISTS key_window_ms;
ALTER TABLE {{schema}}.delayq_outbox DROP CONSTRAINT IF EXISTS delayq_outbox_concurrency_key_check;
ALTER TABLE {{schema}}.delayq_outbox DROP COLUMN IF EXISTS concurrency_key;
