package schedrun

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/schedspec"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/schedule"
)

// The operator's actions on a schedule (delayq schedules pause|resume|run, the
// dashboard): each is one transaction on the schedule's row, which every runner
// locks to evaluate it, so an action waits for an evaluation under way and the
// next evaluation sees it.

var (
	// ErrNotFound reports a schedule no process ran on the database and that
	// is not among the declared ones given.
	ErrNotFound = errors.New("no such schedule")
	// ErrNoPayload reports a manual run of a schedule whose task no runner of
	// migration 00020 on has written yet (it writes the payload at each
	// evaluation): run a relay or worker of this version once, or give the
	// schedule's declaration.
	ErrNoPayload = errors.New("the schedule's payload is not known yet")
	// ErrRunKey reports a run key that is not one NewRunKey writes.
	ErrRunKey = schedspec.ErrRunKey
)

// DB is a database to act on: a pool, or a connection.
type DB interface {
	outbox.Querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Actions acts on the schedules of one outbox's schema.
type Actions struct {
	ob    *outbox.Client
	table string
}

// NewActions returns the actions on the schedules of ob's schema; a manual run
// is enqueued through ob.
func NewActions(ob *outbox.Client) *Actions {
	return &Actions{ob: ob, table: fmt.Sprintf(`"%s".%s`, ob.Config().Schema, tableName)}
}

// Change is what Pause or Resume did.
type Change struct {
	// Changed is false when the schedule was already so (paused, or running).
	Changed bool
	// At is since when the schedule is so: paused at, or resumed at (zero for a
	// schedule that was never paused).
	At time.Time
}

// Pause pauses the schedule name: from the pause's commit on, no runner
// enqueues a tick of it; the ticks that fall while it is paused are counted as
// missed. Ticks enqueued before (due within a runner's lookahead) stay. A
// schedule of declared (the schedules of the caller's file or client) that no
// runner evaluated yet is registered, paused, as a runner would register it:
// its first runner finds it paused. Pausing a paused schedule changes nothing.
func (a *Actions) Pause(ctx context.Context, db DB, name string, declared []ScheduleDecl) (Change, error) {
	return a.set(ctx, db, name, declared, true)
}

// Resume resumes the schedule name: the ticks that fell while it was paused
// stay missed (none is caught up, whatever its missed-tick policy), and the
// next one after the resume is enqueued as usual. Resuming a running schedule
// changes nothing.
func (a *Actions) Resume(ctx context.Context, db DB, name string) (Change, error) {
	return a.set(ctx, db, name, nil, false)
}

// set pauses or resumes name in one transaction, registering a declared
// schedule's row first.
func (a *Actions) set(ctx context.Context, db DB, name string, declared []ScheduleDecl, pause bool) (Change, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return Change{}, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	if err := a.registerDeclared(ctx, tx, name, declared); err != nil {
		return Change{}, err
	}
	var paused, resumed *time.Time
	err = tx.QueryRow(ctx, `SELECT paused_at, resumed_at FROM `+a.table+` WHERE name = $1 FOR UPDATE`, name).Scan(&paused, &resumed)
	if errors.Is(err, pgx.ErrNoRows) {
		return Change{}, fmt.Errorf("schedule %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return Change{}, fmt.Errorf("schedule %s: %w", name, err)
	}
	switch {
	case pause && paused != nil:
		return Change{At: *paused}, nil
	case !pause && paused == nil:
		out := Change{}
		if resumed != nil {
			out.At = *resumed
		}
		return out, nil
	}
	set := `paused_at = now()`
	if !pause {
		set = `paused_at = NULL, resumed_at = now()`
	}
	out := Change{Changed: true}
	if err := tx.QueryRow(ctx, `UPDATE `+a.table+` SET `+set+` WHERE name = $1 RETURNING now()`, name).Scan(&out.At); err != nil {
		return Change{}, fmt.Errorf("schedule %s: %w", name, err)
	}
	return out, tx.Commit(ctx)
}

// registerDeclared registers the row of name when declared declares it (a row
// there already is left as it is).
func (a *Actions) registerDeclared(ctx context.Context, q outbox.Querier, name string, declared []ScheduleDecl) error {
	for _, d := range declared {
		switch {
		case d.s != nil && d.s.Name == name:
			var next *time.Time
			if t := d.s.spec.Next(time.Now()); !t.IsZero() {
				next = &t
			}
			return register(ctx, q, a.table, d.s, nil, next)
		case d.st != nil && d.st.Name == name:
			// Known by its state: no payload until its first runner writes it.
			if _, err := q.Exec(ctx, `INSERT INTO `+a.table+` (name, queue, spec, time_zone, last_tick, next_tick)
VALUES ($1, $2, $3, $4, now(), $5) ON CONFLICT (name) DO NOTHING`, d.st.Name, d.st.Queue, d.st.Spec, d.st.TimeZone, d.st.NextTickUTC); err != nil {
				return fmt.Errorf("register: %w", err)
			}
			return nil
		}
	}
	return nil
}

// Run is a manual run of a schedule.
type Run struct {
	Queue, ID string
	// Duplicate: the run's key had been used: its task was enqueued before
	// (the same request sent twice), and nothing was.
	Duplicate bool
}

// RunNow enqueues one tick of the schedule name now, through the outbox as a
// runner enqueues a tick (its queue, payload and max attempts), with the task
// id RunID(name, key): the same key names the same task, which the outbox's
// unique key enqueues once. The schedule's ticks are left as they are (its last
// and next tick, paused or not); its row records the run as its last manual
// one. A schedule of declared no runner evaluated yet is registered first.
func (a *Actions) RunNow(ctx context.Context, db DB, name, key string, declared []ScheduleDecl) (Run, error) {
	if _, err := schedspec.ParseRunKey(key); err != nil {
		return Run{}, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return Run{}, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	if err := a.registerDeclared(ctx, tx, name, declared); err != nil {
		return Run{}, err
	}
	var task outbox.Task
	var maxAttempts *int
	err = tx.QueryRow(ctx, `SELECT queue, payload, max_attempts FROM `+a.table+` WHERE name = $1 FOR UPDATE`, name).
		Scan(&task.Queue, &task.Payload, &maxAttempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return Run{}, fmt.Errorf("schedule %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return Run{}, fmt.Errorf("schedule %s: %w", name, err)
	}
	if task.Payload == nil || maxAttempts == nil {
		return Run{}, fmt.Errorf("schedule %s: %w: no relay or worker of this version has run it", name, ErrNoPayload)
	}
	task.ID, task.MaxAttempts = schedspec.RunID(name, key), *maxAttempts
	res, err := a.ob.EnqueueMany(ctx, tx, []outbox.Task{task})
	if err != nil {
		return Run{}, fmt.Errorf("schedule %s: %w", name, err)
	}
	run := Run{Queue: task.Queue, ID: task.ID, Duplicate: res.Duplicates > 0}
	if !run.Duplicate {
		if _, err := tx.Exec(ctx, `UPDATE `+a.table+` SET last_run_id = $2, last_run_at = now() WHERE name = $1`, name, task.ID); err != nil {
			return Run{}, fmt.Errorf("schedule %s: %w", name, err)
		}
	}
	return run, tx.Commit(ctx)
}

// ScheduleDecl is a declared schedule that no runner may have evaluated yet:
// compiled from its declaration (Declare), or known by the state a client lists
// for it (DeclaredStates).
type ScheduleDecl struct {
	s  *compiled
	st *delayqtype.ScheduleState
}

// DeclaredStates returns the schedules of states that no runner evaluated yet
// (UpdatedAt zero: declared on a client, as Client.Schedules lists them), for
// Pause to register. Registered so, a schedule has no payload until its first
// runner writes it: RunNow refuses it until then (ErrNoPayload).
func DeclaredStates(states []delayqtype.ScheduleState) []ScheduleDecl {
	var out []ScheduleDecl
	for i := range states {
		if states[i].UpdatedAt.IsZero() {
			out = append(out, ScheduleDecl{st: &states[i]})
		}
	}
	return out
}

// Declare compiles declared schedules for Pause and RunNow (defaults applied;
// an invalid one is an error).
func Declare(declared []schedule.Schedule) ([]ScheduleDecl, error) {
	cfg := schedule.Config{Schedules: declared}.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	out := make([]ScheduleDecl, len(cfg.Schedules))
	for i, s := range cfg.Schedules {
		spec, err := schedspec.Compile(s.Cron, s.TimeZone, s.Every)
		if err != nil { // validated: not reached
			return nil, err
		}
		out[i] = ScheduleDecl{s: &compiled{Schedule: s, spec: spec}}
	}
	return out, nil
}
