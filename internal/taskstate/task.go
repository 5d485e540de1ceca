package taskstate

import (
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/delayq/delayq/internal/dispatch"
)

// RedisRow is what Redis gets of an outbox row: the columns TakeDue returns and
// RowColumns names. Every path that writes a task into Redis from the outbox (the
// relay's round, reconcile's restore and the self-healing repair, delayqtest's
// kit) builds it with Task, so that none can drop a field the others keep.
type RedisRow struct {
	ID string
	// State is the row's state (queued, for TakeDue's rows).
	State       State
	RunAt       time.Time
	Payload     []byte
	Attempt     int
	MaxAttempts int
	Version     int
	// TraceContext is the enqueue's trace context, nil for none (NULL).
	TraceContext *string
	// StartBy is the start deadline, nil for none (NULL).
	StartBy  *time.Time
	Priority int
	// ConcurrencyKey is the task's concurrency key, nil for none (NULL).
	ConcurrencyKey *string
}

// Task is the one encoder of an outbox row into the task the enqueue and repair
// scripts take: payload, due time, attempts, version, trace context, start
// deadline and priority, each as the row holds it.
func (r RedisRow) Task() dispatch.Task {
	t := dispatch.Task{
		ID: r.ID, Payload: r.Payload, RunAt: r.RunAt,
		MaxAttempts: r.MaxAttempts, Attempt: r.Attempt, Version: r.Version,
		Priority: r.Priority,
	}
	if r.TraceContext != nil {
		t.TraceContext = *r.TraceContext
	}
	if r.StartBy != nil {
		t.StartBy = *r.StartBy
	}
	if r.ConcurrencyKey != nil {
		t.Key = *r.ConcurrencyKey
	}
	return t
}

// ScanRow reads one row of a statement that selects RowColumns (Lookup, Lock),
// for pgx.CollectRows.
func ScanRow(row pgx.CollectableRow) (RedisRow, error) {
	var r RedisRow
	err := row.Scan(r.columns()...)
	return r, err
}

// columns are the scan targets of RowColumns, in order.
func (r *RedisRow) columns() []any {
	return []any{&r.ID, &r.State, &r.Version, &r.Attempt, &r.MaxAttempts, &r.RunAt, &r.Payload,
		&r.TraceContext, &r.StartBy, &r.Priority, &r.ConcurrencyKey}
}

// Taken is one row of a relay round, as TakeDue returns it: its ctid, its queue
// and RowColumns.
type Taken struct {
	CTID  pgtype.TID // the row's, for MarkInvalid
	Queue string
	RedisRow
	// Shards is the queue's shard count in Postgres (1 for a queue without
	// controls), which the round routes by; 0 when the relay's role may not read
	// delayq_queues: route by the count Redis holds. Set by the relay
	// (ShardedQueues), not by ScanTaken.
	Shards int
}

// ScanTaken reads one row TakeDue returns, for pgx.CollectRows.
func ScanTaken(row pgx.CollectableRow) (Taken, error) {
	var x Taken
	err := row.Scan(append([]any{&x.CTID, &x.Queue}, x.columns()...)...)
	return x, err
}
