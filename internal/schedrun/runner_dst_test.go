package schedrun

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/schedule"
)

// TestRunnersAcrossDaylightSaving runs three runners, on clocks 0, 5 and 10
// minutes apart, through the six hours around each change of the table above
// (a simulated clock, 20 minutes a round), with a daily schedule at a time the
// change skips or repeats, an hourly one and one every 15 minutes. The outbox
// then holds exactly the ticks of a reference that reads every minute's wall clock
// (a time in a gap at the gap's end, a repeated one at its first occurrence), one
// task each; rewinding the schedules' state halfway enqueues only duplicates.
// Before wallclock.go, the daily schedule had no task on the spring day and two
// on the autumn one.
func TestRunnersAcrossDaylightSaving(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	ob, err := outbox.New(outbox.Config{Schema: "public"})
	if err != nil {
		t.Fatal(err)
	}
	type window struct {
		zone  string
		day   string
		hour  int // the hour the change skips or repeats
		start time.Time
	}
	var windows []window
	for _, tr := range transitions {
		windows = append(windows, window{tr.zone, tr.gapDay, tr.gapHour, time.Time{}}, window{tr.zone, tr.repeatDay, tr.repeatHour, time.Time{}})
	}
	const (
		span = 6 * time.Hour
		step = 20 * time.Minute
	)
	for i, w := range windows {
		loc, err := time.LoadLocation(w.zone)
		if err != nil {
			t.Fatal(err)
		}
		day, err := time.ParseInLocation("2006-01-02", w.day, loc)
		if err != nil {
			t.Fatal(err)
		}
		start, end := day, day.Add(span)
		exprs := map[string]func(time.Time) bool{
			fmt.Sprintf("30 %d * * *", w.hour): func(l time.Time) bool { return l.Hour() == w.hour && l.Minute() == 30 },
			"0 * * * *":                        func(l time.Time) bool { return l.Minute() == 0 },
			"*/15 * * * *":                     func(l time.Time) bool { return l.Minute()%15 == 0 },
		}
		var cfg schedule.Config
		names := map[string]func(time.Time) bool{}
		spec := map[string]string{}
		for expr, match := range exprs {
			name := fmt.Sprintf("w%d-%d", i, len(names))
			names[name], spec[name] = match, expr
			cfg.Schedules = append(cfg.Schedules, schedule.Schedule{Name: name, Queue: name, Cron: expr, TimeZone: w.zone})
		}
		// Grace spans the window: the ticks the rewind hands back are enqueued
		// again (duplicates), not counted as missed.
		cfg.Lookahead, cfg.Grace = 2*step, span
		var (
			mu  sync.Mutex
			sim = start
		)
		runners := make([]*Runner, 3)
		for k := range runners {
			if runners[k], err = New(cfg, ob, nil); err != nil {
				t.Fatal(err)
			}
			skew := time.Duration(k) * 5 * time.Minute
			runners[k].now = func() time.Time { mu.Lock(); defer mu.Unlock(); return sim.Add(skew) }
		}
		dups := 0
		for at := start; at.Before(end); at = at.Add(step) {
			mu.Lock()
			sim = at
			mu.Unlock()
			if at.Sub(start) == span/2 {
				// The state lost: every runner starts again from the window's start.
				if _, err := pool.Exec(ctx, `UPDATE `+tableName+` SET last_tick = $1 WHERE name LIKE $2`, start, fmt.Sprintf("w%d-%%", i)); err != nil {
					t.Fatal(err)
				}
			}
			var wg sync.WaitGroup
			results := make([][]result, len(runners))
			errs := make([]error, len(runners))
			for k, r := range runners {
				wg.Go(func() { results[k], errs[k] = r.runOnce(ctx, pool) })
			}
			wg.Wait()
			for k := range runners {
				if errs[k] != nil {
					t.Fatalf("%s %s: runner %d: %v", w.zone, w.day, k, errs[k])
				}
				for _, res := range results[k] {
					dups += res.Duplicates
					if res.Missed != 0 {
						t.Fatalf("%s %s: runner %d: %d ticks of %s missed", w.zone, w.day, k, res.Missed, res.Name)
					}
				}
			}
		}
		if dups == 0 {
			t.Errorf("%s %s: the rewind enqueued no duplicates", w.zone, w.day)
		}
		for name, match := range names {
			want := referenceTicks(loc, start, end, match)
			got := outboxTicks(t, pool, name, end)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s %s, schedule %s: tasks at\n%v\nwant\n%v", w.zone, w.day, spec[name], got, want)
			}
		}
	}
}

// referenceTicks walks (start, end) a minute at a time: a minute whose wall clock
// matches and was not shown before is a tick; so is the first minute after a gap
// that skipped a matching wall-clock time.
func referenceTicks(loc *time.Location, start, end time.Time, match func(time.Time) bool) []time.Time {
	var out []time.Time
	seen := map[time.Time]bool{}
	for m := start.Add(time.Minute); m.Before(end); m = m.Add(time.Minute) {
		l := m.In(loc)
		prev := asUTC(m.Add(-time.Minute).In(loc))
		tick := match(l) && !seen[asUTC(l)]
		for w := prev.Add(time.Minute); w.Before(asUTC(l)); w = w.Add(time.Minute) {
			tick = tick || match(w) // a skipped wall-clock minute
		}
		seen[asUTC(l)] = true
		if tick {
			out = append(out, m.UTC())
		}
	}
	return out
}

// outboxTicks returns the run times of the tasks of queue due before end, checking
// that each task's id is its schedule's tick id at its run time.
func outboxTicks(t *testing.T, pool interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, queue string, end time.Time) []time.Time {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT task_id, run_at FROM delayq_outbox WHERE queue = $1 AND run_at < $2 ORDER BY run_at`, queue, end)
	if err != nil {
		t.Fatal(err)
	}
	var (
		id  string
		at  time.Time
		out []time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error {
		if want := schedule.TaskID(schedule.Schedule{Name: queue}, at); id != want {
			return fmt.Errorf("task %q at %v, want id %q", id, at, want)
		}
		out = append(out, at.UTC())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}
