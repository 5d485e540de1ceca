package dispatch

import "github.com/delayq/delayq/internal/validate"

// DefaultPrefix is the key prefix used when Config.Prefix is empty.
const DefaultPrefix = "dq"

// Namespace is the key prefix of one outbox database's tasks: prefix (or
// DefaultPrefix) alone for a deployment of one database, prefix + ":" +
// database when several feed one Redis (docs/DESIGN.md, "Several databases").
// Each database's queues, tasks, controls and epoch marks are keys of their own,
// so a task id is unique per (database, queue, id) and the scripts are unchanged.
// An empty prefix stays empty without a database: the default, or a bound
// client's own prefix, applies.
func Namespace(prefix, database string) string {
	if database == "" {
		return prefix
	}
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return prefix + ":" + database
}

// Keys names the Redis keys of one queue. All of them carry the queue as a hash tag
// ("{queue}"), so they map to one Cluster slot and every script touches one slot.
// With prefix "dq" and queue "payment":
//
//	dq:{payment}:ready          ZSET  member = task id, score = due time
//	dq:{payment}:prio           ZSET  the ready tasks with a priority (Priority)
//	dq:{payment}:active         ZSET  member = task id, score = lease deadline
//	dq:{payment}:dead           ZSET  member = task id, score = time of death
//	dq:{payment}:t:<id>         HASH  the task (see TaskKey)
//	dq:{payment}:ctl            HASH  the queue's controls: paused (ctl.lua)
//	dq:{payment}:h:<minute>     HASH  the queue's history of that minute (History)
//	dq:{payment}:k:…            the concurrency keys' state (KeyPrefix)
//	dq:{payment}:wake           pub/sub channel: the earliest due time moved earlier
//
// A queue of several shards (Controls.Shards) has these keys once a shard, shard
// k > 0 under a hash tag of its own ("{payment#1.7}", see ShardKeys); Wake is the
// queue's one channel.
//
// Scores are Unix seconds with a millisecond fraction ("1700000000.125"). One key
// stands outside every queue:
//
//	dq:queues                   SET   every queue a task was enqueued into or a worker serves (registryKey)
//
// and the worker process registry (workers.go) has a hash tag of its own, which no
// queue can have (a queue name has no ':'):
//
//	dq:{:workers}:index         ZSET  member = process id, score = last beat
//	dq:{:workers}:p:<id>        HASH  the process (r record, s started, b last beat)
type Keys struct {
	Ready  string
	Active string
	Dead   string
	// Priority is the queue's priority index: every ready task with a priority
	// (Task.Priority 1..9) is in it as well as in Ready, with score
	// (9 - priority) * 10^13 + its due time in Unix ms, so the claim script finds
	// the due tasks of the highest priority first. It exists only while the queue
	// has such a task.
	Priority string
	// TaskPrefix is the prefix of the task hash keys; TaskKey appends the id.
	TaskPrefix string
	// Control is the queue's controls (a HASH: v version, p "1" while paused),
	// mirrored from Postgres; the claim script reads it. Its field y, written by
	// the scripts alone, flags the Priority index: the claim script reads the
	// index only while y is set.
	Control string
	// History is the prefix of the per-minute history hashes; the minute (Unix
	// time / 60, Redis clock) completes the key. See Client.History.
	History string
	// KeyPrefix is the prefix of the concurrency-key state (lib.lua key_admit):
	// KeyPrefix+"run" HASH key -> runs holding a slot, KeyPrefix+"p:"+key ZSET
	// the key's parked tasks, KeyPrefix+"s:"+key ZSET its throttle's starts,
	// KeyPrefix+"wake" ZSET key -> when its throttle lets the next start in,
	// KeyPrefix+"keys" SET the keys with parked tasks, KeyPrefix+"h" HASH key ->
	// "<due ms>:<id>" of its head (fair dispatch), KeyPrefix+"n" the count of
	// parked tasks. Written only while the queue caps or throttles its keys.
	KeyPrefix string
	// Wake is a pub/sub channel, not a key.
	Wake string
}

// KeysFor builds the keys of queue under prefix, after validating both: the keys
// of its shard 0 (ShardKeys).
func KeysFor(prefix, queue string) (Keys, error) {
	if err := validate.Prefix(prefix); err != nil {
		return Keys{}, err
	}
	if err := validate.Queue(queue); err != nil {
		return Keys{}, err
	}
	return layout(prefix, queue, prefix+":{"+queue+"}:wake"), nil
}

// layout lays out the keys of the hash tag tag, the only place that does.
func layout(prefix, tag, wake string) Keys {
	base := prefix + ":{" + tag + "}:"
	return Keys{
		Ready:      base + "ready",
		Active:     base + "active",
		Dead:       base + "dead",
		Priority:   base + "prio",
		TaskPrefix: base + "t:",
		Control:    base + "ctl",
		History:    base + "h:",
		KeyPrefix:  base + "k:",
		Wake:       wake,
	}
}

// registryKey is the set of queue names under prefix: the queues the reaper visits.
// (A queue name cannot contain ':' or '{', so it cannot collide with a queue's keys.)
func registryKey(prefix string) string { return prefix + ":queues" }

// WorkerKeys are the keys of the worker process registry under prefix: the index
// ZSET and the prefix of the process hashes, which the process id completes. One
// hash tag, so each script touches one slot.
func WorkerKeys(prefix string) (index, procPrefix string) {
	base := prefix + ":{:workers}:"
	return base + "index", base + "p:"
}

// TaskKey is the key of the hash of task id. The task hash has short fields, and a
// field at its default value may be absent:
//
//	s  status: "r" ready, "a" active, "d" done, "x" dead (absent = "r")
//	p  payload (always present until the task is done)
//	a  attempts started so far (absent = 0)
//	m  max attempts (absent = 25)
//	v  outbox version; an enqueue with a higher one replaces the task (absent = 1)
//	t  lease token, only while active
//	e  last error summary, after a failure
//	d  start deadline in Unix ms, only for a task that has one (outbox.Task.StartBy)
//	y  priority 1..9, only for a task that has one (absent = 0; outbox.Task.Priority)
//	c  trace context, only for a task that has one (outbox.Task.TraceContext)
//	k  concurrency key, only for a task that has one (outbox.Task.ConcurrencyKey)
//	q  "1" while its run holds a slot of its key (claim.lua)
//
// A new task is written with p and only the fields that differ from their defaults,
// in one order (lib.lua write_task, for enqueue and for repair's restore alike), so
// a ready task with default settings is a one-field hash. Scripts read both forms.
// The hash is also the Redis dedupe record: enqueue of an id whose hash exists is a
// duplicate. A done task keeps only "s" (and "v"), with the done retention as its TTL.
//
// Memory (Redis 7, jemalloc, 100,000 ready tasks with a 20-byte payload, queue
// "payment", ids "order-0000001"): about 234 bytes per ready task, hash and ZSET
// member together (250 when the task sets max attempts or a version); about 155 per
// done task kept for the retention. Allocations come in size classes (16, 32, 48,
// 64 bytes ...): a task key longer than 28 bytes, or a payload that makes the hash
// listpack exceed 32 bytes (48 with non-default fields), costs the next class.
func (k Keys) TaskKey(id string) string { return k.TaskPrefix + id }

// hashTag returns the part of key Redis Cluster hashes: the content of the first
// "{...}" with at least one byte inside, else the whole key.
func hashTag(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j == i+1 {
						return key
					}
					return key[i+1 : j]
				}
			}
			return key
		}
	}
	return key
}
