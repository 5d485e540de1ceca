package schedspec

import (
	"time"

	"github.com/robfig/cron/v3"
)

// This file reads a cron expression on the wall clock of its time zone across
// daylight saving. robfig/cron's SpecSchedule.Next walks absolute time in the
// zone, so a time in the spring-forward gap never matches (2:30 on the day New
// York skips from 2:00 to 3:00: no tick that day) and a time in the repeated
// fall-back hour matches twice (1:30 EDT and 1:30 EST: two ticks, two tasks). The
// rule here, as most crons keep it: the expression picks wall-clock times; a time
// in a gap runs once, at the first instant after the gap, and a time that repeats
// runs once, at its first occurrence. Interval schedules (every, @every) are
// absolute time and not affected.

// wallNext returns the first tick of cs in loc strictly after t, by the rule
// above (zero: none within five years). cs's fields are matched against a wall
// clock held as a UTC time, where no time is skipped or repeated.
func wallNext(cs *cron.SpecSchedule, loc *time.Location, t time.Time) time.Time {
	w := wallAfterRepeat(t.In(loc))
	for range 4 { // the first candidate is the answer; a bound, not a search
		w = cs.Next(w)
		if w.IsZero() {
			return w
		}
		if at := instant(w, loc); at.After(t) {
			return at.UTC()
		}
	}
	return time.Time{}
}

// wallAfterRepeat returns the wall clock of t as a UTC time, to search ticks after.
// When t is in the second pass of a repeated hour, the wall-clock times of that
// hour ran in the first pass: the search then starts at the hour's end.
func wallAfterRepeat(t time.Time) time.Time {
	w := asUTC(t)
	start, _ := t.ZoneBounds()
	if start.IsZero() {
		return w
	}
	_, off := t.Zone()
	_, prev := start.Add(-time.Nanosecond).Zone()
	if prev <= off {
		return w
	}
	// Fall back at start, by prev-off: the wall clock of [start, start+back)
	// was shown once already, before start.
	if end := asUTC(start).Add(time.Duration(prev-off) * time.Second); w.Before(end) {
		return end.Add(-time.Nanosecond)
	}
	return w
}

// instant is the instant of wall-clock time w (a UTC time holding the fields) in
// loc: the first of two when w repeats, the end of the gap when w is skipped.
func instant(w time.Time, loc *time.Location) time.Time {
	// time.Date picks either instant of a repeated time, and something near for
	// a skipped one; the candidates are w read with the offsets around it.
	d := time.Date(w.Year(), w.Month(), w.Day(), w.Hour(), w.Minute(), w.Second(), w.Nanosecond(), loc)
	start, end := d.ZoneBounds()
	var best time.Time
	for _, near := range []time.Time{start.Add(-time.Nanosecond), d, end} {
		if near.Year() < 2 { // ZoneBounds' zero: no transition on that side
			continue
		}
		_, off := near.In(loc).Zone()
		at := w.Add(-time.Duration(off) * time.Second).In(loc)
		if asUTC(at).Equal(w) && (best.IsZero() || at.Before(best)) {
			best = at
		}
	}
	if !best.IsZero() {
		return best
	}
	// In a gap: the first instant after it is the transition, d's zone's start
	// when d is past the gap, its end when d is before it.
	if asUTC(d).After(w) {
		return start
	}
	return end
}

// asUTC returns the wall clock of t as a UTC time with the same fields.
func asUTC(t time.Time) time.Time {
	return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
}
