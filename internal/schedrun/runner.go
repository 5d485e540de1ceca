// Package schedrun runs the schedules of package schedule: it enqueues each
// tick into the outbox a little before it falls due, once across every process
// that runs the same schedule (the relay with Config.Schedules, a delayq client
// with schedules declared on it), and lists the schedules' states for the
// client and the CLI. See package schedule's doc for the rules.
package schedrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/schedspec"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/schedule"
)

// tableName is the table of schedule states, created by package migrations
// (00005; time_zone and last_enqueued since 00018; paused_at, resumed_at,
// payload, max_attempts, last_run_id and last_run_at since 00020).
const tableName = "delayq_schedules"

// maxScan bounds the ticks one evaluation of a cron schedule walks through (a
// runner back after a long outage with a per-second schedule); the next
// evaluation goes on from there.
const maxScan = 100_000

// compiled is a validated schedule with its timing.
type compiled struct {
	schedule.Schedule
	spec schedspec.Spec
}

// Compile returns the timing of s, a schedule valid by schedule's rules.
func Compile(s schedule.Schedule) (schedspec.Spec, error) {
	if err := (schedule.Config{Schedules: []schedule.Schedule{s}}).Validate(); err != nil {
		return schedspec.Spec{}, err
	}
	return schedspec.Compile(s.Cron, s.TimeZone, s.Every)
}

// zoneName is the zone a schedule's times are shown in.
func zoneName(s schedule.Schedule) string {
	if s.Cron != "" && s.TimeZone != "" {
		return s.TimeZone
	}
	return "UTC"
}

// Runner enqueues the ticks of a Config into one outbox. Any number of Runners
// on one database, in any number of processes, share the work.
type Runner struct {
	cfg   schedule.Config
	sch   []compiled
	ob    *outbox.Client
	table string
	log   *slog.Logger
	// otherSpec holds the schedules found declared differently elsewhere, warned
	// of once.
	otherSpec map[string]bool
	// now, when set (tests), stands in for the database's clock.
	now func() time.Time
}

// New returns a Runner for cfg (defaults applied, validated) that enqueues
// through ob, into ob's schema. log may be nil.
func New(cfg schedule.Config, ob *outbox.Client, log *slog.Logger) (*Runner, error) {
	if ob == nil {
		return nil, fmt.Errorf("%w: nil outbox client", schedule.ErrInvalid)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	sch := make([]compiled, len(cfg.Schedules))
	for i, s := range cfg.Schedules {
		spec, err := schedspec.Compile(s.Cron, s.TimeZone, s.Every)
		if err != nil { // validated: not reached
			return nil, fmt.Errorf("%w: schedule %s: %v", schedule.ErrInvalid, s.Name, err)
		}
		sch[i] = compiled{Schedule: s, spec: spec}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Runner{cfg: cfg, sch: sch, ob: ob, table: fmt.Sprintf(`"%s".%s`, ob.Config().Schema, tableName), log: log,
		otherSpec: map[string]bool{}}, nil
}

// Run evaluates the schedules every Wait until ctx ends. A failed round is
// passed to onErr and retried after a jittered backoff between backoffMin and
// backoffMax (capped by Wait).
func (r *Runner) Run(ctx context.Context, pool outbox.DB, onErr func(error), backoffMin, backoffMax time.Duration) {
	failures := 0
	for ctx.Err() == nil {
		wait := r.Wait()
		if err := r.RunOnce(ctx, pool); err != nil {
			if ctx.Err() != nil {
				return
			}
			onErr(err)
			wait = min(wait, backoff(backoffMin, backoffMax, failures))
			failures++
		} else {
			failures = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// backoff is the n-th delay of a jittered exponential backoff: drawn from
// [d/2, d] with d = min(hi, lo * 2^n) ("equal jitter").
func backoff(lo, hi time.Duration, n int) time.Duration {
	d := hi
	if n < 30 {
		d = min(hi, lo<<n)
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// result is what one evaluation did to one schedule.
type result struct {
	Name string
	// Locked: another runner held the schedule's row; it does this round.
	Locked bool
	// Enqueued ticks (new tasks), Duplicates (ticks whose task existed already),
	// Missed ticks dropped by the policy or while the schedule was paused.
	Enqueued, Duplicates, Missed int
	// Paused: the schedule is paused; nothing was enqueued.
	Paused bool
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
	zone := zoneName(s.Schedule)
	var clock *time.Time
	if r.now != nil {
		t := r.now()
		clock = &t
	}
	// A new schedule starts at the database's now: no tick before it is missed.
	// Its next tick, by this process's clock, is there for readers from the
	// start (the evaluation below sets it by the database's).
	from := time.Now()
	if clock != nil {
		from = *clock
	}
	var firstNext *time.Time
	if t := s.spec.Next(from); !t.IsZero() {
		firstNext = &t
	}
	if err := register(ctx, pool, r.table, s, clock, firstNext); err != nil {
		return res, err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return res, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	var last, now time.Time
	var paused, resumed *time.Time
	var spec string
	err = tx.QueryRow(ctx, `SELECT last_tick, spec, now(), paused_at, resumed_at FROM `+r.table+` WHERE name = $1 FOR UPDATE SKIP LOCKED`,
		s.Name).Scan(&last, &spec, &now, &paused, &resumed)
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
	if spec != s.spec.Text && !r.otherSpec[s.Name] {
		// Declared differently elsewhere (another process, an older deploy):
		// whoever evaluates it writes its own. Said once.
		r.otherSpec[s.Name] = true
		r.log.Warn("schedule: declared with another spec by another runner", "schedule", s.Name, "spec", s.spec.Text, "other", spec)
	}
	// The ticks that fell while the schedule was paused, up to now while it is,
	// up to its resume after: missed, never enqueued (no catch-up), and the
	// schedule goes on after them.
	var ticks []time.Time
	skipped, newLast, stop := 0, last, false
	switch {
	case paused != nil:
		skipped, newLast, _ = skip(s.spec, s.Every, last, now)
		res.Paused, stop = true, true
	case resumed != nil && resumed.After(last):
		// Cut off by maxScan: the next evaluation goes on from newLast.
		skipped, newLast, stop = skip(s.spec, s.Every, last, *resumed)
	}
	missed := 0
	if !stop {
		ticks, missed, newLast = r.ticks(s, newLast, now)
	}
	res.Missed, res.LastTick = skipped+missed, newLast
	if len(ticks) > 0 {
		tasks := make([]outbox.Task, len(ticks))
		for i, t := range ticks {
			tasks[i] = outbox.Task{Queue: s.Queue, ID: schedule.TaskID(s.Schedule, t), RunAt: t, Payload: s.Payload, MaxAttempts: s.MaxAttempts}
		}
		mr, err := r.ob.EnqueueMany(ctx, tx, tasks)
		if err != nil {
			return res, err
		}
		res.Enqueued, res.Duplicates = mr.Inserted, mr.Duplicates
	}
	// The last tick enqueued (by this runner or, a duplicate, another): ticks
	// are in time order.
	var lastEnqueued *time.Time
	if len(ticks) > 0 {
		lastEnqueued = &ticks[len(ticks)-1]
	}
	res.NextTick = s.spec.Next(newLast)
	var next *time.Time
	if !res.NextTick.IsZero() {
		next = &res.NextTick
	}
	if _, err := tx.Exec(ctx, `UPDATE `+r.table+`
SET queue = $2, spec = $3, time_zone = $4, last_tick = $5, next_tick = $6, enqueued = enqueued + $7, missed = missed + $8,
    last_enqueued = GREATEST(last_enqueued, $9::timestamptz), payload = $10, max_attempts = $11, updated_at = now()
WHERE name = $1`, s.Name, s.Queue, s.spec.Text, zone, newLast, next, res.Enqueued, res.Missed, lastEnqueued,
		payloadOf(s.Schedule), s.MaxAttempts); err != nil {
		return res, fmt.Errorf("advance: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("commit: %w", err)
	}
	if missed > 0 {
		r.log.Warn("schedule: ticks missed while no relay ran", "schedule", s.Name,
			"missed", missed, "policy", string(s.Missed), "caught_up", catchUp(s, res))
	}
	return res, nil
}

func catchUp(s *compiled, res result) int {
	if s.Missed != schedule.CatchUp {
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
	if s.Missed == schedule.CatchUp {
		keep = s.CatchUp
	}
	newLast = last
	t := s.spec.Next(last)
	// Missed ticks: an interval's are counted by arithmetic, a cron schedule's
	// walked through (at most maxScan a round).
	if s.Every > 0 && !t.IsZero() && t.Before(missBefore) {
		every := s.Every.Milliseconds()
		lastMissed := missBefore.UnixMilli() - 1
		lastMissed -= schedspec.Mod(lastMissed, every)
		n := int((lastMissed-t.UnixMilli())/every) + 1
		k := min(keep, n)
		missed = n - k
		for i := k - 1; i >= 0; i-- {
			ticks = append(ticks, time.UnixMilli(lastMissed-int64(i)*every).UTC())
		}
		newLast = time.UnixMilli(lastMissed).UTC()
		t = s.spec.Next(newLast)
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
		t = s.spec.Next(t)
	}
	if !t.IsZero() && t.Before(missBefore) {
		// Cut off by maxScan among missed ticks: the most recent ones are yet to
		// come, so none of these is caught up.
		missed, caught = missed+len(caught), nil
	}
	ticks = append(ticks, caught...)
	return ticks, missed, newLast
}

// register inserts the row of a schedule no runner evaluated yet, as of clock
// (nil: the database's now), with its first next tick; a row there already, a
// paused one say, is left as it is.
func register(ctx context.Context, q outbox.Querier, table string, s *compiled, clock, firstNext *time.Time) error {
	if _, err := q.Exec(ctx, `INSERT INTO `+table+` (name, queue, spec, time_zone, last_tick, next_tick, payload, max_attempts)
VALUES ($1, $2, $3, $4, COALESCE($5::timestamptz, now()), $6, $7, $8) ON CONFLICT (name) DO NOTHING`,
		s.Name, s.Queue, s.spec.Text, zoneName(s.Schedule), clock, firstNext, payloadOf(s.Schedule), s.MaxAttempts); err != nil {
		return fmt.Errorf("register: %w", err)
	}
	return nil
}

// payloadOf is a schedule's payload as its row keeps it: never NULL (NULL is a
// row no runner of migration 00020 on evaluated yet).
func payloadOf(s schedule.Schedule) []byte {
	if s.Payload == nil {
		return []byte{}
	}
	return s.Payload
}

// skip counts the ticks after last up to until (included), the ticks of a
// paused schedule, and returns the cursor past them: until, or, cut off after
// maxScan ticks of a cron schedule, the last one counted (more says so).
func skip(spec schedspec.Spec, every time.Duration, last, until time.Time) (n int, cursor time.Time, more bool) {
	if !until.After(last) {
		return 0, last, false
	}
	if every > 0 { // the multiples of every in (last, until], by arithmetic
		e := every.Milliseconds()
		a, b := last.UnixMilli(), until.UnixMilli()
		return int((b-schedspec.Mod(b, e))/e - (a-schedspec.Mod(a, e))/e), until, false
	}
	cursor = last
	for t := spec.Next(last); !t.IsZero() && !t.After(until); t = spec.Next(t) {
		if n == maxScan {
			return n, cursor, true
		}
		n, cursor = n+1, t
	}
	return n, until, false
}
