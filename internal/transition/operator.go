package transition

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
)

// The producer's and the operator's transitions, and the repair of Redis from
// Postgres.

// Cancel (cancel) cancels queue/id if it is pending or queued, in q (the
// caller's transaction, or a statement of its own), and reports whether it did.
// Postgres only: a worker that runs the task's copy cannot complete it (its
// guard refuses), and reconcile removes it from Redis (or RemoveFinished now).
func (o *Ops) Cancel(ctx context.Context, q taskstate.Querier, queue, id string) (bool, error) {
	tag, err := q.Exec(ctx, o.store.SQL.Cancel, queue, id)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// Reschedule (reschedule) moves queue/id, if pending or queued, to runAt as a
// new version, in q, notifying the relay at commit; it reports whether it did.
// Postgres only: the relay's move of the new version replaces the older one in
// Redis (the enqueue script keys each copy by its version).
func (o *Ops) Reschedule(ctx context.Context, q taskstate.Querier, queue, id string, runAt time.Time) (bool, error) {
	rows, err := q.Query(ctx, o.store.SQL.Reschedule, queue, id, runAt)
	if err != nil {
		return false, err
	}
	var version, notified int64
	n := 0
	if _, err := pgx.ForEachRow(rows, []any{&version, &notified}, func() error { n++; return nil }); err != nil {
		return false, err
	}
	return n > 0, nil
}

// RetryDeadEdited (dead-edit-retry) retries the dead task queue/id with payload,
// only while its row is that dead version, in q; it returns the new version (0:
// nothing changed). Postgres only, as Reschedule.
func (o *Ops) RetryDeadEdited(ctx context.Context, q taskstate.Querier, queue, id string, version int, payload []byte) (int, error) {
	rows, err := q.Query(ctx, o.store.SQL.RetryDeadEdited, queue, id, version, payload)
	if err != nil {
		return 0, err
	}
	var (
		next     int
		notified int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&next, &notified}, func() error { return nil }); err != nil {
		return 0, err
	}
	return next, nil
}

// RetryDead (dead-retry) retries up to limit dead rows of queues (empty: all),
// only ids when given, in one statement that notifies the relay at commit; it
// returns how many. Postgres only, as Reschedule.
func (o *Ops) RetryDead(ctx context.Context, q taskstate.Querier, queues, ids []string, limit int) (int, error) {
	rows, err := q.Query(ctx, o.store.SQL.RetryDead, nonNil(queues), nonNil(ids), limit)
	if err != nil {
		return 0, err
	}
	var (
		qu, id   string
		notified int64
	)
	tag, err := pgx.ForEachRow(rows, []any{&qu, &id, &notified}, func() error { return nil })
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// Purged is what PurgeDead did.
type Purged struct {
	// Deleted rows.
	Deleted int
	// Unkeyed are the deleted rows (queue/id) no Redis key can hold (written by
	// hand, or by an older version): nothing of them was in Redis.
	Unkeyed []string
}

// PurgeDead (dead-purge) deletes up to limit dead rows of queues (empty: all),
// only ids when given, in one statement on db (its own transaction: a pool or a
// connection), then removes from Redis what it holds of each at that version or
// an older one. An error with Deleted > 0 is Redis's: the rows are gone, and
// reconcile removes what stays in Redis.
func (o *Ops) PurgeDead(ctx context.Context, db taskstate.Querier, queues, ids []string, limit int) (Purged, error) {
	if _, ok := db.(pgx.Tx); ok {
		return Purged{}, errors.New("transition: a purge commits before it writes Redis: give it a pool or a connection, not a transaction")
	}
	rows, err := db.Query(ctx, o.store.SQL.PurgeDead, nonNil(queues), nonNil(ids), limit)
	if err != nil {
		return Purged{}, err
	}
	byQueue := map[string][]dispatch.Task{}
	var (
		order []string
		q     string
		t     dispatch.Task
	)
	tag, err := pgx.ForEachRow(rows, []any{&q, &t.ID, &t.Version}, func() error {
		if _, ok := byQueue[q]; !ok {
			order = append(order, q)
		}
		byQueue[q] = append(byQueue[q], dispatch.Task{ID: t.ID, Version: t.Version})
		return nil
	})
	if err != nil {
		return Purged{}, err
	}
	out := Purged{Deleted: int(tag.RowsAffected())}
	// Committed: now Redis, queue by queue.
	for _, q := range order {
		tasks := byQueue[q]
		if validate.Queue(q) != nil {
			for _, t := range tasks {
				out.Unkeyed = append(out.Unkeyed, q+"/"+t.ID)
			}
			continue
		}
		valid := tasks[:0]
		for _, t := range tasks {
			if validate.TaskID(t.ID) != nil {
				out.Unkeyed = append(out.Unkeyed, q+"/"+t.ID)
				continue
			}
			valid = append(valid, t)
		}
		if _, err := o.removeVersions(ctx, q, valid); err != nil {
			return out, redisStep("remove purged tasks of "+q, err)
		}
	}
	return out, nil
}

// ErrLive reports a task whose row is live: RemoveFinished leaves it.
var ErrLive = errors.New("transition: the task is live in the outbox")

// RemoveFinished (cancel, its Redis part at once) removes from Redis what it
// holds of queue/id once its row is finished or gone: every copy at the row's
// version or an older one (any version when there is no row). It reports
// whether anything was removed; ErrLive when the row is live.
func (o *Ops) RemoveFinished(ctx context.Context, db taskstate.Querier, queue, id string) (bool, error) {
	if err := errors.Join(validate.Queue(queue), validate.TaskID(id)); err != nil {
		return false, err
	}
	row, err := o.store.Row(ctx, db, queue, id)
	switch {
	case err != nil:
		return false, err
	case row.Exists && row.State.Live():
		return false, fmt.Errorf("%w: %s/%s is %s", ErrLive, queue, id, row.State)
	}
	version := validate.MaxVersion
	if row.Exists {
		version = row.Version
	}
	n, err := o.removeVersions(ctx, queue, []dispatch.Task{{ID: id, Version: version}})
	return n > 0, err
}

// removeVersions removes from Redis what it holds of each task at the task's
// version or an older one, probing again the few that change between the probe
// and the removal; a newer version (the id enqueued again meanwhile) is left
// alone. It returns how many it removed.
func (o *Ops) removeVersions(ctx context.Context, q string, tasks []dispatch.Task) (int, error) {
	removed := 0
	for start := 0; start < len(tasks); start += 1000 {
		todo := tasks[start:min(start+1000, len(tasks))]
		for round := 0; len(todo) > 0; round++ {
			if round == 10 {
				return removed, fmt.Errorf("%s/%s keeps changing in Redis; try again", q, todo[0].ID)
			}
			ids := make([]string, len(todo))
			for i, t := range todo {
				ids[i] = t.ID
			}
			_, probes, err := o.dq.Probe(ctx, q, ids...)
			if err != nil {
				return removed, err
			}
			var (
				repairs []dispatch.Repair
				asked   []dispatch.Task
			)
			for i, t := range todo {
				p := probes[i]
				if p.State == dispatch.StateMissing && !p.InReady && !p.InActive && !p.InDead || p.Version > t.Version {
					continue
				}
				repairs = append(repairs, dispatch.Repair{Op: dispatch.RepairRemove, ID: t.ID, Fingerprint: p.Fingerprint})
				asked = append(asked, t)
			}
			if len(repairs) == 0 {
				break
			}
			applied, err := o.dq.RepairIf(ctx, q, repairs...)
			if err != nil {
				return removed, err
			}
			var again []dispatch.Task
			for i, ok := range applied {
				if ok {
					removed++
				} else {
					again = append(again, asked[i])
				}
			}
			todo = again
		}
	}
	return removed, nil
}

// Repair (repair) makes Redis follow Postgres for tasks of queue whose rows tx
// holds locked (reconcile's settle): each repair is a compare-and-set on the
// task as probed (restore, kill, remove), routed by shards, the count Postgres
// holds. applied[i] false: the task changed since its probe. The caller commits
// tx after.
func (o *Ops) Repair(ctx context.Context, tx pgx.Tx, queue string, shards int, repairs ...dispatch.Repair) ([]bool, error) {
	if tx == nil {
		return nil, errors.New("transition: a repair needs the transaction that holds the rows locked")
	}
	return o.dq.RepairIfRouted(ctx, queue, shards, repairs...)
}

// Expedite (expedite; for tests: package delayqtest) makes the live row r of
// queue due at once in Redis, whatever Redis holds for it: nothing, a ready copy
// due later (a retry's backoff, a snooze), or an active one (its lease is taken
// over: the old run's token no longer completes it). It restores the task as the
// relay's move encodes it (taskstate.RedisRow.Task), with r's attempts, due at the
// earliest time Redis takes: ahead of every task of its priority. A test that
// wants the next run to be the last passes r with Attempt = MaxAttempts-1.
// Each restore is a compare-and-set on a probe, retried while the task changes.
func (o *Ops) Expedite(ctx context.Context, queue string, r taskstate.RedisRow) error {
	if !r.State.Live() {
		return fmt.Errorf("transition: expedite %s/%s: %w (%s)", queue, r.ID, ErrRefused, r.State)
	}
	t := r.Task()
	t.RunAt = time.Unix(1, 0)
	for range 10 {
		_, probes, err := o.dq.Probe(ctx, queue, r.ID)
		if err != nil {
			return err
		}
		if p := probes[0]; p.Version > r.Version {
			return fmt.Errorf("transition: expedite %s/%s: %w (Redis holds version %d, the row %d)", queue, r.ID, ErrRefused, p.Version, r.Version)
		}
		applied, err := o.dq.RepairIf(ctx, queue, dispatch.Repair{Op: dispatch.RepairRestore, ID: r.ID, Fingerprint: probes[0].Fingerprint, Task: t})
		if err != nil {
			return err
		}
		if applied[0] {
			return nil
		}
	}
	return fmt.Errorf("transition: expedite %s/%s keeps changing in Redis; try again", queue, r.ID)
}

// nonNil turns nil into an empty slice: pgx sends nil as NULL, not as an empty array.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
