package schedule

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
)

// tableName is the table of schedule states, created by package migrations.
const tableName = "delayq_schedules"

// maxScan bounds the ticks one evaluation of a cron schedule walks through (a
// relay back after a long outage with a per-second schedule); the next evaluation
// goes on from there.
const maxScan = 100_000

// Runner enqueues the ticks of a Config into one outbox. The relay runs one
// (relay.Config.Schedules); any number of Runners on one database share the work.
type Runner struct {
	cfg   Config
	sch   []compiled
	ob    *outbox.Client
	table string
	log   *slog.Logger
	// now, when set (tests), stands in for the database's clock.
	now func() time.Time
}

// NewRunner returns a Runner for cfg (defaults applied, validated) that enqueues
// through ob, into ob's schema. log may be nil.
func NewRunner(cfg Config, ob *outbox.Client, log *slog.Logger) (*Runner, error) {
	if ob == nil {
		return nil, bad("nil outbox client")
	}
	cfg = cfg.WithDefaults()
	sch, err := compile(cfg)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Runner{cfg: cfg, sch: sch, ob: ob, table: fmt.Sprintf(`"%s".%s`, ob.Config().Schema, tableName), log: log}, nil
}

// result is what one evaluation did to one schedule.
type result struct {
	Name string
	// Locked: another runner held the schedule's row; it does this round.
	Locked bool
	// Enqueued ticks (new tasks), Duplicates (ticks whose task existed already),
	// Missed ticks dropped by the policy.
	Enqueued, Duplicates, Missed int
	// LastTick is the last tick enqueued or dropped; NextTick the one after it.
	LastTick, NextTick time.Time
}

// RunOnce evaluates every schedule once: in one transaction per schedule, it
// enqueues the ticks due by now + Lookahead that were not enqueued yet, applies
// the missed-tick policy, and advances the schedule's last tick.
func (r *Runner) RunOnce(ctx context.Context, pool outbox.DB) error {
	_, err := r.runOnce(ctx, pool)
	return err
}

// runOnce is RunOnce, with what it did to each schedule.
func (r *Runner) runOnce(ctx context.Context, pool outbox.DB) ([]result, error) {
	out := make([]result, 0, len(r.sch))
	var errs []error
	for i := range r.sch {
		res, err := r.evaluate(ctx, pool, &r.sch[i])
		if err != nil {
			errs = append(errs, fmt.Errorf("schedule %s: %w", r.sch[i].Name, err))
			continue
		}
		out = append(out, res)
	}
	return out, errors.Join(errs...)
}

// Wait is how long a runner waits between two evaluations: half the lookahead, so
// every tick is enqueued at least that long before it falls due.
func (r *Runner) Wait() time.Duration { return r.cfg.Lookahead / 2 }

func (r *Runner) evaluate(ctx context.Context, pool outbox.DB, s *compiled) (result, error) {
	res := result{Name: s.Name}
	var clock *time.Time
	if r.now != nil {
		t := r.now()
		clock = &t
	}
	// A new schedule starts at the database's now: no tick before it is missed.
	if _, err := pool.Exec(ctx, `INSERT INTO `+r.table+` (name, queue, spec, last_tick)
VALUES ($1, $2, $3, COALESCE($4::timestamptz, now())) ON CONFLICT (name) DO NOTHING`, s.Name, s.Queue, s.spec, clock); err != nil {
		return res, fmt.Errorf("register: %w", err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return res, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	var last, now time.Time
	err = tx.QueryRow(ctx, `SELECT last_tick, now() FROM `+r.table+` WHERE name = $1 FOR UPDATE SKIP LOCKED`, s.Name).Scan(&last, &now)
	if errors.Is(err, pgx.ErrNoRows) {
		res.Locked = true
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("lock: %w", err)
	}
	if clock != nil {
		now = *clock
	}
	ticks, missed, newLast := r.ticks(s, last, now)
	res.Missed, res.LastTick = missed, newLast
	if len(ticks) > 0 {
		tasks := make([]outbox.Task, len(ticks))
		for i, t := range ticks {
			tasks[i] = outbox.Task{Queue: s.Queue, ID: TaskID(s.Schedule, t), RunAt: t, Payload: s.Payload, MaxAttempts: s.MaxAttempts}
		}
		mr, err := r.ob.EnqueueMany(ctx, tx, tasks)
		if err != nil {
			return res, err
		}
		res.Enqueued, res.Duplicates = mr.Inserted, mr.Duplicates
	}
	res.NextTick = s.next(newLast)
	var next *time.Time
	if !res.NextTick.IsZero() {
		next = &res.NextTick
	}
	if _, err := tx.Exec(ctx, `UPDATE `+r.table+`
SET queue = $2, spec = $3, last_tick = $4, next_tick = $5, enqueued = enqueued + $6, missed = missed + $7, updated_at = now()
WHERE name = $1`, s.Name, s.Queue, s.spec, newLast, next, res.Enqueued, res.Missed); err != nil {
		return res, fmt.Errorf("advance: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("commit: %w", err)
	}
	if res.Missed > 0 {
		r.log.Warn("schedule: ticks missed while no relay ran", "schedule", s.Name,
			"missed", res.Missed, "policy", string(s.Missed), "caught_up", catchUp(s, res))
	}
	return res, nil
}

func catchUp(s *compiled, res result) int {
	if s.Missed != CatchUp {
		return 0
	}
	return min(s.CatchUp, res.Enqueued+res.Duplicates)
}

// ticks returns the ticks to enqueue after last, given the database's now: the
// ones due by now + Lookahead, less the missed ones (due before now - Grace) that
// the policy drops; how many it dropped; and the new last tick.
func (r *Runner) ticks(s *compiled, last, now time.Time) (ticks []time.Time, missed int, newLast time.Time) {
	limit := now.Add(r.cfg.Lookahead)
	missBefore := now.Add(-r.cfg.Grace)
	keep := 0
	if s.Missed == CatchUp {
		keep = s.CatchUp
	}
	newLast = last
	t := s.next(last)
	// Missed ticks: an interval's are counted by arithmetic, a cron schedule's
	// walked through (at most maxScan a round).
	if s.Every > 0 && !t.IsZero() && t.Before(missBefore) {
		every := s.Every.Milliseconds()
		lastMissed := missBefore.UnixMilli() - 1
		lastMissed -= mod(lastMissed, every)
		n := int((lastMissed-t.UnixMilli())/every) + 1
		k := min(keep, n)
		missed = n - k
		for i := k - 1; i >= 0; i-- {
			ticks = append(ticks, time.UnixMilli(lastMissed-int64(i)*every).UTC())
		}
		newLast = time.UnixMilli(lastMissed).UTC()
		t = s.next(newLast)
	}
	var caught []time.Time // the most recent `keep` missed ticks of a cron schedule
	for scanned := 0; !t.IsZero() && !t.After(limit) && scanned < maxScan; scanned++ {
		if t.Before(missBefore) {
			if keep > 0 {
				if len(caught) == keep {
					caught = caught[1:]
					missed++
				}
				caught = append(caught, t)
			} else {
				missed++
			}
		} else {
			if caught != nil {
				ticks, caught = append(ticks, caught...), nil
			}
			ticks = append(ticks, t)
		}
		newLast = t
		t = s.next(t)
	}
	if !t.IsZero() && t.Before(missBefore) {
		// Cut off by maxScan among missed ticks: the most recent ones are yet to
		// come, so none of these is caught up.
		missed, caught = missed+len(caught), nil
	}
	ticks = append(ticks, caught...)
	return ticks, missed, newLast
}

// State is a schedule as the table delayq_schedules holds it: what a relay ran
// last.
type State struct {
	Name  string `json:"name"`
	Queue string `json:"queue"`
	Spec  string `json:"spec"`
	// LastTick is the last tick enqueued or dropped; NextTick the one after it
	// (nil: none within five years).
	LastTick time.Time  `json:"last_tick"`
	NextTick *time.Time `json:"next_tick"`
	// Enqueued counts the ticks enqueued, Missed those dropped by the policy.
	Enqueued int64 `json:"enqueued"`
	Missed   int64 `json:"missed"`
	// UpdatedAt is when a relay last evaluated it.
	UpdatedAt time.Time `json:"updated_at"`
}

// List reads the states of every schedule a relay ran on the database, by name.
// schema is the outbox's ("" for "public").
func List(ctx context.Context, q outbox.Querier, schema string) ([]State, error) {
	if schema == "" {
		schema = taskstate.DefaultSchema
	}
	if _, err := outbox.New(outbox.Config{Schema: schema}); err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, fmt.Sprintf(`SELECT name, queue, spec, last_tick, next_tick, enqueued, missed, updated_at
FROM "%s".%s ORDER BY name`, schema, tableName))
	if err != nil {
		return nil, fmt.Errorf("schedule: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (State, error) {
		var s State
		err := r.Scan(&s.Name, &s.Queue, &s.Spec, &s.LastTick, &s.NextTick, &s.Enqueued, &s.Missed, &s.UpdatedAt)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("schedule: list: %w", err)
	}
	return out, nil
}
