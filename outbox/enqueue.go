package outbox

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/delayq/delayq/internal/notmigrated"
	"github.com/delayq/delayq/internal/validate"
)

// Result reports what one enqueue did.
type Result struct {
	// Duplicate is true when a task with this queue and id exists already (in any state,
	// for as long as its row is kept) or came earlier in the same batch. Nothing was
	// written for it, and the caller's transaction is unharmed.
	Duplicate bool
	// RunAt is when the new task is due, on the database clock when a Delay was given;
	// for a task replaced or debounced, its new due time. Zero for a duplicate.
	RunAt time.Time
	// Replaced is true when Task.Replace replaced the payload and due time of the
	// task of this key (a new version), Debounced when Task.Debounce did (its due
	// time pushed back, capped by MaxWait). Both false with Duplicate false: the
	// task was inserted.
	Replaced, Debounced bool
}

// ManyResult reports what EnqueueMany did.
type ManyResult struct {
	// Inserted counts the new tasks, Duplicates the others; they add up to the number of
	// tasks given.
	Inserted, Duplicates int
	// Results holds one Result per task given, in the same order.
	Results []Result
}

// Enqueue inserts t into the outbox through q, normally the caller's transaction, so the
// task exists if and only if that transaction commits. The relay is notified at commit
// when the task is due within Config.NotifyWithin, unless an enqueue into the same queue
// notified moments before and has committed (Config.NotifyCooldown).
// A task whose queue and id exist already is reported as Result.Duplicate, without an
// error: the caller's transaction stays usable; unless t sets a conflict policy
// (Task.Replace, Task.Debounce), which replaces or debounces that task while it has
// yet to start (Result.Replaced, Result.Debounced) and refuses one queued and due
// with ErrRunning, nothing written, the transaction usable as well.
//
// Invalid input is reported before anything is sent, with an error wrapping one of the
// sentinels listed at Validate, or ErrQueueType for a task a typed Queue built whose
// payload type is not the one c has for the queue (see Queue); a StartBy before the
// due time (now plus Delay, on the database clock) is refused by the statement
// itself, ErrInvalidTask, nothing
// written and the transaction usable.
func (c *Client) Enqueue(ctx context.Context, q Querier, t Task) (Result, error) {
	res, err := c.enqueue(ctx, pgxRunner{q}, t)
	return res, notmigrated.Classify(err)
}

// EnqueueSQL is Enqueue on a database/sql transaction (or sqlx, or GORM's ConnPool).
func (c *Client) EnqueueSQL(ctx context.Context, tx SQLQuerier, t Task) (Result, error) {
	res, err := c.enqueue(ctx, sqlRunner{tx}, t)
	return res, notmigrated.Classify(err)
}

// EnqueueMany inserts tasks in one statement, one round trip however many they are.
// Every task is validated first: if one is invalid, the error names its index and
// nothing is sent. Duplicates (of existing rows, or of an earlier task in the same
// slice) are counted and marked in Results. The relay is notified once per queue at
// commit.
//
// All payloads travel in one message, which Postgres limits to 1 GB: split batches of
// large payloads accordingly.
func (c *Client) EnqueueMany(ctx context.Context, q Querier, tasks []Task) (ManyResult, error) {
	res, err := c.enqueueMany(ctx, pgxRunner{q}, tasks)
	return res, notmigrated.Classify(err)
}

// EnqueueManySQL is EnqueueMany on a database/sql transaction. The driver must be pgx's
// (github.com/jackc/pgx/v5/stdlib), which can send arrays.
func (c *Client) EnqueueManySQL(ctx context.Context, tx SQLQuerier, tasks []Task) (ManyResult, error) {
	res, err := c.enqueueMany(ctx, sqlRunner{tx}, tasks)
	return res, notmigrated.Classify(err)
}

func (c *Client) enqueue(ctx context.Context, r runner, t Task) (Result, error) {
	if err := c.admit(t); err != nil {
		return Result{}, fmt.Errorf("outbox: enqueue: %w", err)
	}
	w := c.row(ctx, t)
	if t.conflict() != 0 {
		return c.enqueueReplace(ctx, r, &t, w)
	}
	res := Result{Duplicate: true}
	sent := time.Now()
	id, createdAt, renew := c.notifiers.lookup(w.queue, sent)
	var (
		notified int64
		me       = notifier{id: w.id, sent: sent}
	)
	var created *time.Time // NULL: refused for its start deadline
	stmt := c.sql.Enqueue
	if w.startBy != nil {
		stmt = c.sql.EnqueueStartBy // checked against the due time in the statement
	}
	err := r.query(ctx, stmt, []any{w.queue, w.id, w.runAt, w.delayUS, w.payload, w.maxAttempts, w.trace, w.startBy, w.priority, id, createdAt, w.key},
		func(scan func(...any) error) error {
			res.Duplicate = false
			return scan(&res.RunAt, &notified, &created)
		})
	if created != nil {
		me.createdAt = *created
	}
	c.notifiers.done(w.queue, me, renew, err == nil && notified > 0)
	if err != nil {
		return Result{}, fmt.Errorf("outbox: enqueue %s/%s: %w", t.Queue, t.ID, err)
	}
	if !res.Duplicate && created == nil {
		return Result{}, fmt.Errorf("outbox: enqueue %s/%s: %w", t.Queue, t.ID, lateStartBy(t.StartBy, res.RunAt))
	}
	return res, nil
}

// enqueueReplace is enqueue with t's conflict policy, w its row: one statement
// (EnqueueReplace), and a second only when the policy did not apply, to tell
// why from the row it left locked. It notifies at every commit (no cooldown),
// as Reschedule does.
func (c *Client) enqueueReplace(ctx context.Context, r runner, t *Task, w row) (Result, error) {
	var (
		res      Result
		version  int64
		notified int64
		applied  bool
	)
	err := r.query(ctx, c.sql.EnqueueReplace,
		[]any{w.queue, w.id, w.runAt, w.delayUS, w.payload, w.maxAttempts, w.trace, w.priority,
			t.conflict(), t.Debounce.Microseconds(), t.MaxWait.Microseconds(), w.key},
		func(scan func(...any) error) error {
			applied = true
			return scan(&version, &res.RunAt, &notified)
		})
	if err != nil {
		return Result{}, fmt.Errorf("outbox: enqueue %s/%s: %w", t.Queue, t.ID, err)
	}
	if applied {
		if version > 1 {
			res.Replaced, res.Debounced = t.Replace, t.Debounce > 0
		}
		return res, nil
	}
	var (
		live    bool
		due     bool
		startBy *time.Time
		found   bool
	)
	err = r.query(ctx, c.sql.ConflictRow, []any{w.queue, w.id}, func(scan func(...any) error) error {
		found = true
		return scan(&live, &due, &startBy)
	})
	switch {
	case err != nil:
		return Result{}, fmt.Errorf("outbox: enqueue %s/%s: %w", t.Queue, t.ID, err)
	case found && !live:
		return Result{Duplicate: true}, nil // finished: done, dead or cancelled
	case due:
		return Result{}, fmt.Errorf("outbox: enqueue %s/%s: %w: queued and due, so not replaced; nothing changed", t.Queue, t.ID, ErrRunning)
	case startBy != nil:
		return Result{}, fmt.Errorf("outbox: enqueue %s/%s: %w: the task's deadline %s is before its new due time: it could never start; nothing changed",
			t.Queue, t.ID, validate.ErrInvalidStartBy, startBy.UTC().Format(time.RFC3339Nano))
	}
	// Neither applied nor explained by the row the statement locked: not
	// expected; say so rather than guess.
	return Result{}, fmt.Errorf("outbox: enqueue %s/%s: the task changed concurrently; try again", t.Queue, t.ID)
}

// lateStartBy is the error of a start deadline the statement refused: before the
// task's due time, on the database clock.
func lateStartBy(startBy, due time.Time) error {
	return fmt.Errorf("%w: %s is before the task's due time %s (its run-at, or now plus its delay on the database clock): it could never start",
		validate.ErrInvalidStartBy, startBy.UTC().Format(time.RFC3339Nano), due.UTC().Truncate(time.Millisecond).Format(time.RFC3339Nano))
}

type key struct{ queue, id string }

// compareTasks orders tasks by key, bytewise (the COLLATE "C" order of the SQL).
func compareTasks(a, b *Task) int {
	if c := strings.Compare(a.Queue, b.Queue); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

func (c *Client) enqueueMany(ctx context.Context, r runner, tasks []Task) (ManyResult, error) {
	for i, t := range tasks {
		err := c.admit(t)
		if err == nil && t.conflict() != 0 {
			err = fmt.Errorf("%w: Replace and Debounce are Enqueue's alone", validate.ErrInvalidConflict)
		}
		if err != nil {
			return ManyResult{}, fmt.Errorf("outbox: enqueue many: task %d of %d: %w", i, len(tasks), err)
		}
	}
	out := ManyResult{Results: make([]Result, len(tasks))}
	if len(tasks) == 0 {
		return out, nil
	}
	// The tasks are sent, and inserted, in key order, so that overlapping batches
	// cannot deadlock (see the statement). Ties keep their given order, so the first
	// of several tasks with one key is sent and the others, right after it, are
	// duplicates.
	order := make([]int, len(tasks))
	for i := range order {
		order[i] = i
	}
	sorted := true
	for i := 1; i < len(tasks) && sorted; i++ {
		sorted = compareTasks(&tasks[i-1], &tasks[i]) <= 0
	}
	if !sorted {
		slices.SortFunc(order, func(i, j int) int {
			if c := compareTasks(&tasks[i], &tasks[j]); c != 0 {
				return c
			}
			return cmp.Compare(i, j)
		})
	}
	var (
		sent     = make([]int, 0, len(tasks)) // sent[k] is the index of the kth task sent
		queues   = make([]string, 0, len(tasks))
		ids      = make([]string, 0, len(tasks))
		runAts   = make([]*time.Time, 0, len(tasks))
		delays   = make([]time.Duration, 0, len(tasks))
		payloads = make([][]byte, 0, len(tasks))
		attempts = make([]int32, 0, len(tasks))
		traces   []*string // nil while no task has a trace context
		startBys = make([]*time.Time, 0, len(tasks))
		prios    []int16   // nil while every task has priority 0
		keys     []*string // nil while no task has a concurrency key
	)
	for _, i := range order {
		t := &tasks[i]
		if len(sent) > 0 && compareTasks(&tasks[sent[len(sent)-1]], t) == 0 {
			out.Results[i] = Result{Duplicate: true}
			out.Duplicates++
			continue
		}
		sent = append(sent, i)
		w := c.row(ctx, *t)
		queues = append(queues, w.queue)
		ids = append(ids, w.id)
		runAts = append(runAts, w.runAt)
		delays = append(delays, time.Duration(w.delayUS)*time.Microsecond)
		payloads = append(payloads, w.payload)
		attempts = append(attempts, w.maxAttempts)
		if w.trace != nil && traces == nil {
			traces = make([]*string, len(sent)-1, len(tasks))
		}
		if traces != nil {
			traces = append(traces, w.trace)
		}
		startBys = append(startBys, w.startBy)
		if w.priority != 0 && prios == nil {
			prios = make([]int16, len(sent)-1, len(tasks))
		}
		if prios != nil {
			prios = append(prios, w.priority)
		}
		if w.key != nil && keys == nil {
			keys = make([]*string, len(sent)-1, len(tasks))
		}
		if keys != nil {
			keys = append(keys, w.key)
		}
	}
	var (
		inserted int64
		now      time.Time // statement_timestamp(): run_at of a task with a delay is now + delay
		named    map[key]bool
		lateAt   int // 1-based position among the tasks sent of a start deadline refused
		lateDue  time.Time
	)
	err := r.query(ctx, c.sql.EnqueueMany, []any{queues, ids, runAts, delays, payloads, attempts, traces, startBys, prios, keys},
		func(scan func(...any) error) error {
			var (
				n, notified int64
				at          time.Time
				k           key
			)
			if err := scan(&n, &at, &notified, &k.queue, &k.id); err != nil {
				return err
			}
			if n >= 0 { // the summary
				inserted, now = n, at
				return nil
			}
			if n == -2 { // refused: notified holds the task's position
				lateAt, lateDue = int(notified), at
				return nil
			}
			if named == nil {
				named = make(map[key]bool)
			}
			named[k] = true
			return nil
		})
	if err != nil {
		return ManyResult{}, fmt.Errorf("outbox: enqueue many (%s): %w", tasksN(len(tasks)), err)
	}
	if lateAt > 0 && lateAt <= len(sent) {
		i := sent[lateAt-1]
		return ManyResult{}, fmt.Errorf("outbox: enqueue many: task %d of %d (%s/%s): %w; nothing was inserted",
			i, len(tasks), tasks[i].Queue, tasks[i].ID, lateStartBy(tasks[i].StartBy, lateDue))
	}
	all := inserted == int64(len(sent))
	if !all && int64(len(named)) != inserted {
		return ManyResult{}, fmt.Errorf("outbox: enqueue many (%s): %d inserted, %d named", tasksN(len(tasks)), inserted, len(named))
	}
	for _, i := range sent {
		t := &tasks[i]
		if !all && !named[key{t.Queue, t.ID}] {
			out.Results[i] = Result{Duplicate: true}
			out.Duplicates++
			continue
		}
		out.Results[i] = Result{RunAt: storedRunAt(t, now)}
		out.Inserted++
	}
	return out, nil
}

// storedRunAt is the run_at the statement stored for t, given its
// statement_timestamp(): RunAt at the microsecond (pgx truncates it so when it sends
// it), or now plus Delay at the microsecond (added exactly, as an interval of
// microseconds), in the time zone the database's times are read in.
// tasksN is "1 task" or "n tasks".
func tasksN(n int) string {
	if n == 1 {
		return "1 task"
	}
	return fmt.Sprintf("%d tasks", n)
}

func storedRunAt(t *Task, now time.Time) time.Time {
	if !t.RunAt.IsZero() {
		return time.UnixMicro(t.RunAt.UnixMicro()).In(now.Location())
	}
	return now.Add(t.Delay.Truncate(time.Microsecond))
}
