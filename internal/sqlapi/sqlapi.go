// Package sqlapi is the Go side of the outbox's SQL API (migration 00022, the
// functions delayq_enqueue, delayq_enqueue_many, delayq_cancel and
// delayq_reschedule in the outbox's schema, with the conflict policies of 00025
// and the concurrency key of 00028; migration 00027, delayq_complete): the SQLSTATE of each error the
// functions raise and the sentinel of package outbox it stands for, and calls of
// the functions with outbox's types, so that tests and benchmarks hold the two
// enqueues side by side (docs/DESIGN.md, "The SQL API").
package sqlapi

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// Sentinel returns the sentinel of the Go API that refuses the input the
// functions refuse with SQLSTATE code, or nil when code is not one of theirs. The
// codes are stable: callers in any language branch on them (docs/DESIGN.md, "The
// SQL API").
func Sentinel(code string) error {
	switch code {
	case "QD001":
		return validate.ErrInvalidQueue
	case "QD002":
		return validate.ErrInvalidTaskID
	case "QD003":
		return outbox.ErrPayloadTooLarge
	case "QD010":
		return validate.ErrInvalidDelay
	case "QD011":
		return validate.ErrInvalidRunAt
	case "QD012":
		return validate.ErrInvalidStartBy
	case "QD013":
		return validate.ErrInvalidMaxAttempts
	case "QD014":
		return validate.ErrInvalidTraceContext
	case "QD015":
		return validate.ErrInvalidPriority
	case "QD016", "QD017":
		return validate.ErrInvalidTask
	case "QD019":
		return validate.ErrInvalidConcurrencyKey
	case "QD018":
		return validate.ErrInvalidConflict
	case "QD020":
		return outbox.ErrNotFound
	case "QD021":
		return outbox.ErrFinished
	case "QD022":
		return outbox.ErrStale
	case "QD023":
		return outbox.ErrRunning
	case "QD030":
		return outbox.ErrInvalidConfig
	}
	return nil
}

// Err returns err wrapping the sentinel of its SQLSTATE when it is a server error
// with one of the API's codes, and err as it is otherwise.
func Err(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		if s := Sentinel(pe.Code); s != nil {
			return fmt.Errorf("%w: %w", s, err)
		}
	}
	return err
}

// Client calls the functions of one schema.
type Client struct {
	schema string
}

// New returns a Client for the functions of schema ("" is the default schema).
func New(schema string) Client {
	if schema == "" {
		schema = taskstate.DefaultSchema
	}
	return Client{schema: schema}
}

// Enqueue calls delayq_enqueue with t's fields (a zero field is passed as NULL,
// unset; the conflict policy as on_conflict, debounce and max_wait) through q.
func (c Client) Enqueue(ctx context.Context, q outbox.Querier, t outbox.Task) (outbox.Result, error) {
	var (
		res     outbox.Result
		due     *time.Time
		outcome string
	)
	err := q.QueryRow(ctx, fmt.Sprintf(`SELECT duplicate, due_at, outcome FROM %s.delayq_enqueue(
	queue => $1, task_id => $2, payload => $3, delay => $4, run_at => $5,
	max_attempts => $6, priority => $7, start_by => $8, trace_context => $9,
	on_conflict => $10, debounce => $11, max_wait => $12, concurrency_key => $13)`, c.schema),
		t.Queue, t.ID, payload(t.Payload), interval(t.Delay), stamp(t.RunAt),
		int4(t.MaxAttempts), int4(t.Priority), stamp(t.StartBy), text(t.TraceContext),
		text(OnConflict(t)), interval(t.Debounce), interval(t.MaxWait), text(t.ConcurrencyKey),
	).Scan(&res.Duplicate, &due, &outcome)
	if err != nil {
		return outbox.Result{}, fmt.Errorf("sqlapi: enqueue %s/%s: %w", t.Queue, t.ID, Err(err))
	}
	if due != nil {
		res.RunAt = *due
	}
	res.Replaced, res.Debounced = outcome == "replaced", outcome == "debounced"
	return res, nil
}

// Complete calls delayq_complete: the run of version of queue/id is done, in q's
// transaction, or the call fails with the guard's SQLSTATE (QD020, QD021, QD022).
func (c Client) Complete(ctx context.Context, q outbox.Querier, queue, id string, version int) error {
	if _, err := q.Exec(ctx, fmt.Sprintf(`SELECT %s.delayq_complete($1, $2, $3)`, c.schema), queue, id, int32(min(max(version, math.MinInt32), math.MaxInt32))); err != nil {
		return fmt.Errorf("sqlapi: complete %s/%s: %w", queue, id, Err(err))
	}
	return nil
}

// OnConflict is delayq_enqueue's on_conflict for t's policy: "replace",
// "replace_keep_run_at", "debounce", or "" (NULL: a duplicate). Replace wins
// over Debounce, so that a task setting both is refused by the function (a
// debounce without on_conflict debounce, QD018) as by Validate. KeepRunAt
// without Replace has no spelling in SQL: Validate alone refuses it.
func OnConflict(t outbox.Task) string {
	switch {
	case t.Replace && t.KeepRunAt:
		return "replace_keep_run_at"
	case t.Replace:
		return "replace"
	case t.Debounce != 0:
		return "debounce"
	}
	return ""
}

// EnqueueMany calls delayq_enqueue_many with tasks' fields as arrays.
func (c Client) EnqueueMany(ctx context.Context, q outbox.Querier, tasks []outbox.Task) (outbox.ManyResult, error) {
	n := len(tasks)
	var (
		queues   = make([]string, n)
		ids      = make([]string, n)
		payloads = make([][]byte, n)
		delays   = make([]pgtype.Interval, n)
		runAts   = make([]pgtype.Timestamptz, n)
		attempts = make([]pgtype.Int4, n)
		prios    = make([]pgtype.Int4, n)
		startBys = make([]pgtype.Timestamptz, n)
		traces   = make([]pgtype.Text, n)
		keys     = make([]pgtype.Text, n)
	)
	for i, t := range tasks {
		queues[i], ids[i], payloads[i] = t.Queue, t.ID, payload(t.Payload)
		delays[i], runAts[i], startBys[i] = interval(t.Delay), stamp(t.RunAt), stamp(t.StartBy)
		attempts[i], prios[i], traces[i] = int4(t.MaxAttempts), int4(t.Priority), text(t.TraceContext)
		keys[i] = text(t.ConcurrencyKey)
	}
	// An argument no task sets goes as NULL, not as an array of NULLs: the bytes
	// and the parse of an element a task for nothing (as EnqueueMany sends none).
	rows, err := q.Query(ctx, fmt.Sprintf(`SELECT ord, duplicate, due_at FROM %s.delayq_enqueue_many(
	queues => $1, task_ids => $2, payloads => $3, delays => $4, run_ats => $5,
	max_attempts => $6, priorities => $7, start_bys => $8, trace_contexts => $9, concurrency_keys => $10)`, c.schema),
		queues, ids, payloads, orNull(delays, func(v pgtype.Interval) bool { return v.Valid }),
		orNull(runAts, func(v pgtype.Timestamptz) bool { return v.Valid }),
		orNull(attempts, func(v pgtype.Int4) bool { return v.Valid }),
		orNull(prios, func(v pgtype.Int4) bool { return v.Valid }),
		orNull(startBys, func(v pgtype.Timestamptz) bool { return v.Valid }),
		orNull(traces, func(v pgtype.Text) bool { return v.Valid }),
		orNull(keys, func(v pgtype.Text) bool { return v.Valid }))
	if err != nil {
		return outbox.ManyResult{}, fmt.Errorf("sqlapi: enqueue many: %w", Err(err))
	}
	out := outbox.ManyResult{Results: make([]outbox.Result, n)}
	var (
		ord int
		dup bool
		due *time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&ord, &dup, &due}, func() error {
		if ord < 1 || ord > n {
			return fmt.Errorf("ord %d of %d tasks", ord, n)
		}
		r := outbox.Result{Duplicate: dup}
		if due != nil {
			r.RunAt = *due
		}
		out.Results[ord-1] = r
		if dup {
			out.Duplicates++
		} else {
			out.Inserted++
		}
		return nil
	})
	if err != nil {
		return outbox.ManyResult{}, fmt.Errorf("sqlapi: enqueue many: %w", Err(err))
	}
	return out, nil
}

// Cancel calls delayq_cancel.
func (c Client) Cancel(ctx context.Context, q outbox.Querier, queue, id string) error {
	if _, err := q.Exec(ctx, fmt.Sprintf(`SELECT %s.delayq_cancel($1, $2)`, c.schema), queue, id); err != nil {
		return fmt.Errorf("sqlapi: cancel %s/%s: %w", queue, id, Err(err))
	}
	return nil
}

// Reschedule calls delayq_reschedule and returns the task's new version.
func (c Client) Reschedule(ctx context.Context, q outbox.Querier, queue, id string, runAt time.Time) (int, error) {
	var v int
	if err := q.QueryRow(ctx, fmt.Sprintf(`SELECT %s.delayq_reschedule($1, $2, $3)`, c.schema), queue, id, stamp(runAt)).Scan(&v); err != nil {
		return 0, fmt.Errorf("sqlapi: reschedule %s/%s: %w", queue, id, Err(err))
	}
	return v, nil
}

// orNull returns vs, or nil (NULL) when no element of it is set.
func orNull[T any](vs []T, set func(T) bool) []T {
	if slices.ContainsFunc(vs, set) {
		return vs
	}
	return nil
}

func payload(p []byte) []byte {
	if p == nil {
		return nil // NULL: no payload
	}
	return p
}

func interval(d time.Duration) pgtype.Interval {
	return pgtype.Interval{Microseconds: d.Microseconds(), Valid: d != 0}
}

func stamp(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()} }

// int4 is n, 0 as NULL (unset), clamped to int32: the function refuses a value
// out of its bounds as Go does.
func int4(n int) pgtype.Int4 {
	return pgtype.Int4{Int32: int32(min(max(n, math.MinInt32), math.MaxInt32)), Valid: n != 0}
}

func text(s string) pgtype.Text { return pgtype.Text{String: s, Valid: s != ""} }
