-- A queue's shard count (delayq.Controls.Shards): its Redis keys split into this
-- many shards, each in a Cluster slot of its own, a task kept to shard
-- ShardOf(id, shards) for its whole life. Postgres holds the truth and the relay
-- mirrors it into every shard's controls hash with the pause and the rate limit,
-- keyed by the row's version (docs/DESIGN.md, "Shards: the truth in Postgres").
-- outbox.Client.SetQueueShards changes it only while the queue has no pending,
-- queued or dead task. 1, the default, is the layout of a queue before shards
-- existed; 64 is delayq.MaxShards.
--
-- delayq_queues has a row per controlled queue, a handful: a plain transaction,
-- the constant default a catalog change (Postgres 11+).

-- +goose Up
ALTER TABLE {{schema}}.delayq_queues ADD COLUMN shards integer NOT NULL DEFAULT 1
    CONSTRAINT delayq_queues_shards_check CHECK (shards BETWEEN 1 AND 64);

-- +goose Down
ALTER TABLE {{schema}}.delayq_queues DROP COLUMN IF EXISTS shards;
