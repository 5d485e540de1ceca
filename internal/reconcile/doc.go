// Package reconcile holds the operator's tools that look at Postgres and Redis
// together: Reconcile rebuilds Redis from the outbox, Check lists every
// inconsistency without changing anything, Stats counts both sides, and ListDead,
// RetryDead and PurgeDead handle dead letters in both stores at once.
//
// Postgres is the truth; Redis is rebuilt from it. Reconcile walks the outbox of
// each queue in primary-key order (keyset pagination, BatchSize rows a step) and
// reads the same ids in Redis in one atomic probe per step (task hash and ZSET
// memberships together), then walks what Redis holds for the queue (the ready,
// active and dead ZSETs and the task hashes) for ids the outbox does not know.
// Each task falls in one Kind:
//
//	kind                  Postgres        Redis                           repair
//	missing_in_redis      queued          nothing                         enqueue again, attempts and version kept
//	member_without_hash   any             a ZSET member, no task hash     queued: enqueue again; finished: remove
//	hash_without_member   any             a task hash in none of its ZSET queued: enqueue again (active: hand to the reaper); finished: remove
//	status_mismatch       any             hash status and ZSETs disagree  as hash_without_member
//	version_mismatch      queued          ready/active at another version replace with the Postgres version
//	done_in_redis         queued          done                            enqueue again
//	dead_in_redis         queued          dead                            Postgres wins: enqueue again (after Grace)
//	dead_in_postgres      dead            ready or active                 Postgres wins: remove from Redis
//	finished_in_postgres  done, cancelled ready, active or dead           remove from Redis
//	unknown_in_postgres   no row          ready, active or dead           remove from Redis
//
// A done task hash (the Redis dedupe record) next to a finished row or no row at all
// is consistent, and so is nothing in Redis for a finished row. Pending rows are the
// relay's: reconcile reports what it sees of them but leaves them alone. An active
// task past its lease is not an inconsistency either: the reaper takes it back; the
// report counts such tasks as expired leases.
//
// # Safe while relays and workers run
//
// Every repair is decided twice. A first read (Postgres page, then Redis probe) finds
// candidates; for those, reconcile locks their outbox rows (SELECT … FOR UPDATE SKIP
// LOCKED, so it never waits for, nor holds up, a worker or a relay for long), reads
// Redis again, decides again and applies the repair in Redis with a compare-and-set
// script that does nothing if the task changed since that read. While a row is
// locked, no worker can mark it done, cancel, reschedule or kill it: a task that
// completes during the reconcile is seen done and never revived. Rows locked by
// someone else are skipped and counted; the next run sees them. A restore writes the
// task only where the compare-and-set finds Redis as it was, so a task is never
// enqueued twice, and the worker's completion guard in Postgres keeps the effect
// single even for a task that was running when Redis lost it. It writes the task
// the relay's round would (taskstate.RedisRow.Task): payload, due time, attempts,
// version, trace context, start deadline and priority.
//
// A task queued in Postgres and dead in Redis is left alone until its death is older
// than Options.Grace: whoever declares a task dead writes Postgres first, so this is
// rare (a worker whose retry Redis counted out), and the writer mirrors it right
// after.
//
// Dead letters (docs/DESIGN.md, "dead-retry" and "dead-purge"): RetryDead makes the
// outbox row pending again as a new version, due now, attempts reset, in Postgres
// alone; the relay moves it, and its enqueue replaces the dead record in Redis (or
// finds none after a Redis loss). PurgeDead deletes dead rows, then their Redis
// records.
package reconcile
