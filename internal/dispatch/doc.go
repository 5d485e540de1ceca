// Package delayq is the Redis side of delayq: the key layout, the Lua scripts and a
// client that enqueues, claims, leases and finishes delayed tasks.
//
// Postgres (package outbox) is the source of truth; Redis is the timer and the
// dispatcher. Everything here can be rebuilt from Postgres by reconcile.
//
// # Keys
//
// All keys of a queue carry the queue as a Redis Cluster hash tag, so each script
// touches one slot and no script touches two queues (see Keys):
//
//	<prefix>:{<queue>}:ready       ZSET id -> due time
//	<prefix>:{<queue>}:active      ZSET id -> lease deadline
//	<prefix>:{<queue>}:dead        ZSET id -> time of death
//	<prefix>:{<queue>}:t:<id>      HASH the task, also the dedupe record
//	<prefix>:{<queue>}:wake        pub/sub channel for Waiter
//
// The worker process registry (workers.go) has a hash tag of its own, which no queue
// name can form: <prefix>:{:workers}:index (ZSET) and <prefix>:{:workers}:p:<id>
// (HASH, one per process, expiring unless beaten).
//
// Scores are Unix seconds with a millisecond fraction ("1700000000.125"), so
// "redis-cli ZRANGE dq:{payment}:ready -inf 1700000000 BYSCORE" reads naturally.
// Tasks with the same score come out in lexicographic order of their ids: there is
// no FIFO promise within a millisecond.
//
// # Clock
//
// "Now" is always the Redis server's clock (TIME inside the scripts): claims, lease
// deadlines, retries and reaping. Claim reports how long until the next task falls
// due as a duration computed on that clock, so workers with skewed clocks agree.
// A task is never handed out before its due millisecond.
//
// # Life of a task
//
//	Enqueue ──▶ ready ──Claim──▶ active ──Complete──▶ done (hash deleted; kept for Config.DoneRetention if set)
//	              ▲                │ Retry / Reap (runs left, with delay)
//	              └────────────────┤ Release (shutdown, run not counted)
//	                               └ Retry (no runs left), Kill ──▶ dead ──Enqueue (a higher version)──▶ ready
//
// Reap does not kill a task out of runs: it revokes the lease and reports the task,
// which its caller (the relay) makes dead in Postgres first, then here (RepairIf).
//
// Each claim gives the task a fresh lease token. Extend (ExtendMany for a batch,
// one script call), Complete (CompleteMany for a batch, one script call), Retry, Kill and Release need it; a stale token (the lease was reaped, the task rescheduled or
// removed) gets ErrLeaseLost and changes nothing. Claim also counts the run
// (Attempt).
//
// The task hash is the Redis dedupe record: Enqueue of an id whose hash exists is a
// Duplicate, for as long as the task is ready, active or dead, and for
// Config.DoneRetention after it is done (by default the hash is deleted when the task
// is acknowledged: Postgres is the dedupe of tasks that come through the outbox). An
// enqueue with a higher outbox version replaces whatever Redis holds (Reschedule, a
// retry from dead); the relay's enqueue also replaces a finished record, since it
// holds the row as live. Postgres remains the durable dedupe source.
//
// Enqueue writes Redis alone, without an outbox row: such a task runs on a worker's
// plain handler (at least once; Config.DoneRetention is then its dedupe window); a
// transactional handler cannot complete it, since its guard has no row, and the run
// is logged and counted as suppressed.
//
// # Waiting
//
// A claimer with nothing to do sleeps with a Waiter until the next due time or until
// a task is enqueued ahead of it: scripts PUBLISH only when the earliest due time of
// the queue moves earlier, and a Waiter shares one pub/sub connection. An idle
// worker costs one claim per Config.MaxWait (30s) plus a pub/sub ping a minute.
//
// # Redis settings
//
// Use maxmemory-policy noeviction: an evicted ZSET or hash loses tasks until
// reconcile puts them back. Payloads up to 64 bytes keep the task hash a compact
// listpack (about 234 bytes per ready task in all with a 20-byte payload and default
// settings; see Keys.TaskKey).
package dispatch
