package transition

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
)

// The relay's transitions: the move (relay, relay-invalid), the reaper's
// (reap-dead), and retention's (prune).

// StepError tells which store a multi-step operation failed on, and at which
// step; the steps before it stand.
type StepError struct {
	// Redis: the step was Redis's (else Postgres's).
	Redis bool
	Step  string
	Err   error
}

func (e *StepError) Error() string { return e.Step + ": " + e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

func pgStep(step string, err error) error    { return &StepError{Step: step, Err: err} }
func redisStep(step string, err error) error { return &StepError{Redis: true, Step: step, Err: err} }

// Take says what a round takes.
type Take struct {
	// Horizon: rows due within it are taken.
	Horizon time.Duration
	// Limit bounds the rows.
	Limit int
	// Queues limits the round to these queues (none: every queue).
	Queues []string
	// Shards reads the shard count of every sharded queue with the rows
	// (ShardedQueues), which Taken.Shards then holds (1 for the others).
	Shards bool
}

// ErrShardCounts wraps a failure to read the shard counts (the rows' statement
// went through; the round is rolled back).
var ErrShardCounts = errors.New("read the shard counts")

// TakeDue (relay) marks due rows queued in tx and returns them, locked until tx
// ends, in one round trip with tx's commit made asynchronous: losing such a
// commit in a crash leaves the rows pending, and the next round enqueues them
// again, which Redis reports as duplicates (docs/DESIGN.md, "Write orders").
// Move writes them into Redis; then the caller commits tx.
func (o *Ops) TakeDue(ctx context.Context, tx pgx.Tx, t Take) ([]taskstate.Taken, error) {
	b := &pgx.Batch{}
	b.Queue("SET LOCAL synchronous_commit TO off")
	if len(t.Queues) > 0 {
		b.Queue(o.store.SQL.TakeDueQueues, t.Horizon.Microseconds(), t.Limit, t.Queues)
	} else {
		b.Queue(o.store.SQL.TakeDue, t.Horizon.Microseconds(), t.Limit)
	}
	if t.Shards {
		b.Queue(o.store.SQL.ShardedQueues)
	}
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	res, err := br.Query()
	if err != nil {
		return nil, err
	}
	rows, err := pgx.CollectRows(res, taskstate.ScanTaken)
	if err != nil {
		return nil, err
	}
	if t.Shards {
		res, err := br.Query()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrShardCounts, err)
		}
		sharded := map[string]int{}
		var (
			q string
			n int
		)
		if _, err := pgx.ForEachRow(res, []any{&q, &n}, func() error { sharded[q] = n; return nil }); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrShardCounts, err)
		}
		for i := range rows {
			rows[i].Shards = max(sharded[rows[i].Queue], 1)
		}
	}
	return rows, br.Close()
}

// Move (relay) writes the tasks TakeDue took in tx into Redis, in one
// pipelined round trip, while tx holds their rows locked: Redis gets a state
// Postgres commits next (the caller commits tx after Move), and a round that
// fails rolls back, its rows pending again. The enqueue script keys each task by
// its version: an older copy is replaced, a copy of the same version is a
// duplicate.
func (o *Ops) Move(ctx context.Context, tx pgx.Tx, batches []dispatch.QueueTasks) ([][]dispatch.EnqueueStatus, error) {
	if tx == nil {
		return nil, errors.New("transition: a move needs the round's transaction")
	}
	return o.dq.EnqueuePipelined(ctx, batches)
}

// MarkInvalid (relay-invalid) sets dead, with their reasons, the rows of a
// round Redis cannot hold (by ctid, in the round's tx), marked for their
// queue's OnDead hook. Postgres only.
func (o *Ops) MarkInvalid(ctx context.Context, tx pgx.Tx, rows []pgtype.TID, reasons []string) error {
	if _, err := tx.Exec(ctx, o.store.SQL.MarkInvalid, rows, reasons); err != nil {
		return err
	}
	return nil
}

// Reap (reap-dead, its Redis part) takes back up to limit expired leases of
// queue: tasks with runs left are due again after a backoff; the exhausted stay
// held for delayq.ExhaustedHold, for SettleExhausted.
func (o *Ops) Reap(ctx context.Context, queue string, limit int) (dispatch.ReapResult, error) {
	return o.dq.Reap(ctx, queue, limit)
}

// Settled is what SettleExhausted did.
type Settled struct {
	// Tasks were settled; DeadRows of their rows were marked dead.
	Tasks    int
	DeadRows int64
	// Killed are dead in Redis now; Removed were removed from it (their rows
	// finished otherwise, are gone, or are at another version).
	Killed, Removed int
}

// SettleExhausted (reap-dead) settles tasks of queue whose last lease expired
// with no attempt left (ids, from Reap): dead in Postgres first (MarkDead,
// guarded by the version Redis holds, so a row that finished or was rescheduled
// meanwhile is left alone, and marked for the queue's OnDead hook), then Redis
// follows what Postgres now says: dead there too, or removed when the row
// finished otherwise, is gone, or is at another version. Each Redis write is a
// compare-and-set on the task as probed. An error is a *StepError; a task not
// settled stays held and Reap reports it again after the hold.
func (o *Ops) SettleExhausted(ctx context.Context, db taskstate.Querier, queue string, ids []string) (Settled, error) {
	infos, err := o.dq.Inspect(ctx, queue, ids...)
	if err != nil {
		return Settled{}, redisStep("inspect exhausted "+queue, err)
	}
	var (
		qs, tids, errs     []string
		versions, attempts []int32
	)
	for _, ti := range infos {
		if ti.State != dispatch.StateActive {
			continue // changed since the reap: not ours to settle
		}
		msg := ti.LastError
		if msg == "" {
			msg = dispatch.LeaseExpiredError
		}
		qs, tids = append(qs, queue), append(tids, ti.ID)
		versions = append(versions, int32(ti.Version))
		attempts = append(attempts, int32(ti.Attempt))
		errs = append(errs, validate.ErrorSummary(msg))
	}
	if len(tids) == 0 {
		return Settled{}, nil
	}
	tag, err := db.Exec(ctx, o.store.SQL.MarkDead, qs, tids, versions, attempts, errs)
	if err != nil {
		return Settled{}, pgStep("mark exhausted tasks dead", err)
	}
	out := Settled{Tasks: len(tids), DeadRows: tag.RowsAffected()}
	rows, err := o.store.Rows(ctx, db, queue, tids)
	if err != nil {
		return out, pgStep("read exhausted tasks", err)
	}
	_, probes, err := o.dq.Probe(ctx, queue, tids...)
	if err != nil {
		return out, redisStep("probe exhausted "+queue, err)
	}
	var repairs []dispatch.Repair
	for i, p := range probes {
		if p.State != dispatch.StateActive || p.Version != int(versions[i]) {
			continue
		}
		row := rows[p.ID]
		switch {
		case row.Exists && row.State == taskstate.Dead && row.Version == p.Version:
			repairs = append(repairs, dispatch.Repair{Op: dispatch.RepairKill, ID: p.ID, Fingerprint: p.Fingerprint, Error: row.LastError})
			out.Killed++
		case row.Exists && row.State.Live() && row.Version == p.Version:
			// MarkDead did not see it (changed in between): the next reap decides.
		default:
			// Done, cancelled, purged, or another version: nothing of this copy
			// may run or stay.
			repairs = append(repairs, dispatch.Repair{Op: dispatch.RepairRemove, ID: p.ID, Fingerprint: p.Fingerprint})
			out.Removed++
		}
	}
	if len(repairs) > 0 {
		if _, err := o.dq.RepairIf(ctx, queue, repairs...); err != nil {
			return out, redisStep("settle exhausted "+queue, err)
		}
	}
	return out, nil
}

// Prune (prune) deletes up to batch done and cancelled rows that finished more
// than retention ago, in one statement (its own transaction). Postgres only:
// Redis's done records expire on their own.
func (o *Ops) Prune(ctx context.Context, db taskstate.Querier, retention time.Duration, batch int) (int64, error) {
	tag, err := db.Exec(ctx, o.store.SQL.Prune, retention.Microseconds(), batch)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}
