// Package schedspec computes the ticks of a schedule's timing: a cron expression
// read on the wall clock of its time zone (wallclock.go), or a fixed interval
// counted from the Unix epoch. Package schedule validates its Schedules with it;
// internal/schedrun runs them with it. It knows nothing else of a schedule.
package schedspec

import (
	"errors"
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // zones work where the system has no tz database (distroless)

	"github.com/robfig/cron/v3"
)

// Spec is a schedule's timing, compiled.
type Spec struct {
	// Text describes it as the schedules table and `delayq schedules` show it:
	// "cron 0 3 * * * (Europe/Paris)", "every 30s".
	Text string
	// Zone is the time zone the cron expression is read in: UTC for an interval
	// or a cron expression without one.
	Zone *time.Location
	// next returns the first tick strictly after t (zero: none within five years).
	next func(t time.Time) time.Time
}

// Next returns the first tick strictly after t, in UTC (zero: none within five
// years).
func (s Spec) Next(t time.Time) time.Time { return s.next(t) }

// cronParser reads five fields, six with seconds, and descriptors.
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Compile checks a timing: cronExpr (with zone, "" for UTC) or every, not both.
// Its errors are messages for the caller to wrap.
func Compile(cronExpr, zone string, every time.Duration) (Spec, error) {
	switch {
	case cronExpr != "" && every != 0:
		return Spec{}, errors.New("both cron and every; set one")
	case every != 0:
		if zone != "" {
			return Spec{}, errors.New("a time zone applies to cron only")
		}
		if every < time.Millisecond || every%time.Millisecond != 0 {
			return Spec{}, fmt.Errorf("every %v: a whole number of ms, at least 1ms", every)
		}
		ms := every.Milliseconds()
		return Spec{Text: "every " + every.String(), Zone: time.UTC, next: func(t time.Time) time.Time {
			n := t.UnixMilli()
			return time.UnixMilli(n - Mod(n, ms) + ms).UTC()
		}}, nil
	case cronExpr != "":
		if strings.HasPrefix(cronExpr, "TZ=") || strings.HasPrefix(cronExpr, "CRON_TZ=") {
			return Spec{}, errors.New("give the zone as the time zone, not in the cron expression")
		}
		loc := time.UTC
		if zone != "" {
			var err error
			if loc, err = time.LoadLocation(zone); err != nil {
				return Spec{}, fmt.Errorf("time zone %q: %v", zone, err)
			}
		}
		cs, err := cronParser.Parse(cronExpr)
		if err != nil {
			return Spec{}, fmt.Errorf("cron %q: %v", cronExpr, err)
		}
		s := Spec{Text: "cron " + cronExpr, Zone: loc}
		if zone != "" {
			s.Text += " (" + zone + ")"
		}
		if spec, ok := cs.(*cron.SpecSchedule); ok {
			// Fields are matched on the zone's wall clock (wallclock.go): a copy
			// that reads its times as given, in UTC.
			wall := *spec
			wall.Location = time.UTC
			s.next = func(t time.Time) time.Time { return wallNext(&wall, loc, t) }
			return s, nil
		}
		// @every: an interval, absolute time, whatever the zone.
		s.next = func(t time.Time) time.Time {
			n := cs.Next(t.In(loc))
			if n.IsZero() {
				return n
			}
			return n.UTC()
		}
		return s, nil
	default:
		return Spec{}, errors.New("neither cron nor every")
	}
}

// Mod is a modulo b, in [0, b).
func Mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}
