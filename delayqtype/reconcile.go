package delayqtype

import (
	"encoding/json"
	"time"
)

// Kind names an inconsistency between Postgres and Redis, or inside Redis. See the
// package documentation for the table of kinds and their repairs.
type Kind string

// The kinds of inconsistency.
const (
	MissingInRedis     Kind = "missing_in_redis"
	MemberWithoutHash  Kind = "member_without_hash"
	HashWithoutMember  Kind = "hash_without_member"
	StatusMismatch     Kind = "status_mismatch"
	VersionMismatch    Kind = "version_mismatch"
	DoneInRedis        Kind = "done_in_redis"
	DeadInRedis        Kind = "dead_in_redis"
	DeadInPostgres     Kind = "dead_in_postgres"
	FinishedInPostgres Kind = "finished_in_postgres"
	UnknownInPostgres  Kind = "unknown_in_postgres"
)

// Describe says in a few words what the kind means.
func (k Kind) Describe() string {
	switch k {
	case MissingInRedis:
		return "queued in Postgres, absent from Redis"
	case MemberWithoutHash:
		return "a ZSET member without its task hash"
	case HashWithoutMember:
		return "a task hash missing from its ZSET"
	case StatusMismatch:
		return "task hash status and ZSET membership disagree"
	case VersionMismatch:
		return "Redis holds another version than Postgres"
	case DoneInRedis:
		return "queued in Postgres, done in Redis"
	case DeadInRedis:
		return "queued in Postgres, dead in Redis"
	case DeadInPostgres:
		return "dead in Postgres, ready or active in Redis"
	case FinishedInPostgres:
		return "done or cancelled in Postgres, still in a Redis ZSET"
	case UnknownInPostgres:
		return "in Redis, no outbox row"
	}
	return string(k)
}

// Bucket counts the tasks of one category of a Report.
type Bucket struct {
	// Found counts the tasks in this category.
	Found int `json:"found"`
	// Repaired counts those repaired (always 0 in a dry run).
	Repaired int `json:"repaired"`
	// Skipped counts those left alone: pending rows (the relay's), recent deaths
	// (see the grace period), rows locked by someone else, tasks that changed between
	// the read and the repair. The next run looks at them again.
	Skipped int `json:"skipped"`
	// Samples holds up to the reconcile options' Samples of them, as "queue/id".
	Samples []string `json:"samples,omitempty"`
}

// Report tells what Reconcile found and did.
type Report struct {
	DryRun bool     `json:"dry_run"`
	Queues []string `json:"queues"`
	// Rows counts the outbox rows examined; RedisOnly the ids found in Redis without
	// an outbox row.
	Rows      int `json:"postgres_rows"`
	RedisOnly int `json:"redis_only_ids"`
	// Found, Repaired and Skipped add up the buckets of Kinds.
	Found    int `json:"found"`
	Repaired int `json:"repaired"`
	Skipped  int `json:"skipped"`
	// Kinds has one bucket per kind, every kind present.
	Kinds map[Kind]*Bucket `json:"kinds"`
	// ExpiredLeases counts active tasks past their lease, left to the reaper (not
	// inconsistencies: not in Found).
	ExpiredLeases Bucket `json:"expired_leases"`
	// Controls counts the queues whose controls (pause, rate limit) Redis was
	// behind on, restored from Postgres (RestoreControls; left with DryRun).
	Controls int `json:"controls_restored"`
	// Duration is how long the run took. In JSON: duration_ms.
	Duration time.Duration `json:"-"`
}

// MarshalJSON writes Duration as whole milliseconds.
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report
	return json.Marshal(struct {
		plain
		DurationMS int64 `json:"duration_ms"`
	}{plain(r), r.Duration.Milliseconds()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *Report) UnmarshalJSON(b []byte) error {
	type plain Report
	var v struct {
		plain
		DurationMS int64 `json:"duration_ms"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*r = Report(v.plain)
	r.Duration = time.Duration(v.DurationMS) * time.Millisecond
	return nil
}

// Inconsistency is one task Check found wrong.
type Inconsistency struct {
	Kind  Kind   `json:"kind"`
	Queue string `json:"queue"`
	ID    string `json:"id"`
	// Postgres and Redis say what each store holds, e.g. "queued v1" and
	// "ready v1, in no ZSET".
	Postgres string `json:"postgres"`
	Redis    string `json:"redis"`
}

// QueueStats are the counts of one queue in both stores.
type QueueStats struct {
	Queue string `json:"queue"`
	// Postgres counts the outbox rows by state; every state is present.
	Postgres map[State]int64 `json:"postgres"`
	// Estimated: the done and cancelled counts of Postgres are estimates from the
	// planner's statistics (as fresh as the table's last ANALYZE, autovacuum's
	// included), not counts; the others are exact. See Stats.
	Estimated bool `json:"estimated"`
	// Redis counts, read atomically on the Redis clock.
	Ready         int64 `json:"redis_ready"`
	DueNow        int64 `json:"redis_due_now"`
	Active        int64 `json:"redis_active"`
	ExpiredLeases int64 `json:"redis_expired_leases"`
	Dead          int64 `json:"redis_dead"`
	// Overdue counts the ready tasks in Redis due more than a minute ago and not
	// claimed: nobody serves the queue, or its workers fall
	// behind.
	Overdue int64 `json:"redis_overdue"`
	// OldestPendingAge is how long the oldest due pending row has waited for the
	// relay since its run time (database clock): the relay lag. 0 when none is due.
	// In JSON: oldest_pending_age_ms.
	OldestPendingAge time.Duration `json:"-"`
	// OldestDueLateness is how long the earliest ready task in Redis has been due
	// (Redis clock): the worker lag. 0 when none is due. In JSON:
	// oldest_due_lateness_ms.
	OldestDueLateness time.Duration `json:"-"`
}

// MarshalJSON writes the durations as whole milliseconds.
func (s QueueStats) MarshalJSON() ([]byte, error) {
	type plain QueueStats
	return json.Marshal(struct {
		plain
		OldestPendingMS int64 `json:"oldest_pending_age_ms"`
		OldestDueMS     int64 `json:"oldest_due_lateness_ms"`
	}{plain(s), s.OldestPendingAge.Milliseconds(), s.OldestDueLateness.Milliseconds()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *QueueStats) UnmarshalJSON(b []byte) error {
	type plain QueueStats
	var v struct {
		plain
		OldestPendingMS int64 `json:"oldest_pending_age_ms"`
		OldestDueMS     int64 `json:"oldest_due_lateness_ms"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*s = QueueStats(v.plain)
	s.OldestPendingAge = time.Duration(v.OldestPendingMS) * time.Millisecond
	s.OldestDueLateness = time.Duration(v.OldestDueMS) * time.Millisecond
	return nil
}

// DeadTask is a dead outbox row: a task that used its attempts (or was killed)
// and waits for a person.
type DeadTask struct {
	Queue       string `json:"queue"`
	ID          string `json:"id"`
	Attempts    int    `json:"attempts"`
	MaxAttempts int    `json:"max_attempts"`
	LastError   string `json:"last_error"`
	// DiedAt is when the row became dead (zero if not recorded).
	DiedAt  time.Time `json:"died_at"`
	Version int       `json:"version"`
}
