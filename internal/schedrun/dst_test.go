package schedrun

import (
	"fmt"
	"testing"
	"time"

	"github.com/delayq/delayq/schedule"
)

// transition is one year's two daylight-saving changes of a zone, in local time:
// on gapDay the wall clock jumps from gapHour:00 to gapHour+1:00, on repeatDay it
// goes back from repeatHour+1:00 to repeatHour:00. std and dst are the offsets in
// hours.
type transition struct {
	zone                string
	std, dst            int
	gapDay, repeatDay   string // 2006-01-02
	gapHour, repeatHour int
}

var transitions = []transition{
	{"America/New_York", -5, -4, "2026-03-08", "2026-11-01", 2, 1},
	{"America/New_York", -5, -4, "2027-03-14", "2027-11-07", 2, 1},
	{"Europe/Berlin", 1, 2, "2026-03-29", "2026-10-25", 2, 2},
	{"Europe/Berlin", 1, 2, "2027-03-28", "2027-10-31", 2, 2},
	{"Australia/Sydney", 10, 11, "2026-10-04", "2026-04-05", 2, 2},
	{"Australia/Sydney", 10, 11, "2027-10-03", "2027-04-04", 2, 2},
}

// local is the instant of day (2006-01-02) at h:m, read with a fixed offset.
func local(t *testing.T, day string, h, m, offset int) time.Time {
	t.Helper()
	d, err := time.ParseInLocation("2006-01-02", day, time.FixedZone("", offset*3600))
	if err != nil {
		t.Fatal(err)
	}
	return d.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute).UTC()
}

// TestNextAcrossDaylightSaving walks cron expressions across each spring-forward
// and fall-back change of 2026 and 2027 in three zones: a wall-clock time in the
// gap runs once, at the end of the gap; a repeated one runs once, at its first
// occurrence; hourly and every-15-minute expressions follow the same rule. With
// robfig/cron's Next alone, the gap cases had no tick that day and the repeat
// cases two.
func TestNextAcrossDaylightSaving(t *testing.T) {
	t.Parallel()
	for _, tr := range transitions {
		g, r := tr.gapHour, tr.repeatHour
		// Before the gap the zone is on standard time, after it on summer time;
		// around the repeat the other way round.
		cases := []struct {
			name, cron string
			from       time.Time
			want       []time.Time
		}{
			{"gap", fmt.Sprintf("30 %d * * *", g), local(t, tr.gapDay, g-1, 0, tr.std),
				[]time.Time{local(t, tr.gapDay, g+1, 0, tr.dst), local(t, tr.gapDay, 24+g, 30, tr.dst)}},
			{"gap start", fmt.Sprintf("0 %d * * *", g), local(t, tr.gapDay, g-1, 0, tr.std),
				[]time.Time{local(t, tr.gapDay, g+1, 0, tr.dst), local(t, tr.gapDay, 24+g, 0, tr.dst)}},
			{"repeat", fmt.Sprintf("30 %d * * *", r), local(t, tr.repeatDay, r-1, 0, tr.dst),
				[]time.Time{local(t, tr.repeatDay, r, 30, tr.dst), local(t, tr.repeatDay, 24+r, 30, tr.std)}},
			{"repeat, from the second pass", fmt.Sprintf("30 %d * * *", r), local(t, tr.repeatDay, r, 10, tr.std),
				[]time.Time{local(t, tr.repeatDay, 24+r, 30, tr.std)}},
			{"hourly over the gap", "0 * * * *", local(t, tr.gapDay, g-1, 30, tr.std),
				[]time.Time{local(t, tr.gapDay, g+1, 0, tr.dst), local(t, tr.gapDay, g+2, 0, tr.dst)}},
			{"hourly over the repeat", "0 * * * *", local(t, tr.repeatDay, r-1, 30, tr.dst),
				[]time.Time{local(t, tr.repeatDay, r, 0, tr.dst), local(t, tr.repeatDay, r+1, 0, tr.std)}},
			{"every 15 minutes over the gap", "*/15 * * * *", local(t, tr.gapDay, g-1, 40, tr.std),
				[]time.Time{local(t, tr.gapDay, g-1, 45, tr.std), local(t, tr.gapDay, g+1, 0, tr.dst), local(t, tr.gapDay, g+1, 15, tr.dst)}},
			{"every 15 minutes over the repeat", "*/15 * * * *", local(t, tr.repeatDay, r, 40, tr.dst),
				[]time.Time{local(t, tr.repeatDay, r, 45, tr.dst), local(t, tr.repeatDay, r+1, 0, tr.std), local(t, tr.repeatDay, r+1, 15, tr.std)}},
		}
		for _, c := range cases {
			name := fmt.Sprintf("%s %s %s", tr.zone, c.name, tr.gapDay[:4])
			s := schedule.Schedule{Name: "n", Queue: "q", Cron: c.cron, TimeZone: tr.zone}
			at := c.from
			for i, want := range c.want {
				got, err := next(s, at)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if !got.Equal(want) {
					t.Errorf("%s: tick %d after %v is %v, want %v", name, i, at, got, want)
					break
				}
				at = got
			}
		}
	}
}

// TestNextOnceADayEveryDay checks daily expressions over 2026 and 2027 in each
// zone: exactly one tick on each local date, at the wall-clock time asked for, or
// at the end of the gap when that time does not exist that day.
func TestNextOnceADayEveryDay(t *testing.T) {
	t.Parallel()
	for _, zone := range []string{"America/New_York", "Europe/Berlin", "Australia/Sydney"} {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		for _, hm := range [][2]int{{1, 30}, {2, 0}, {2, 30}, {3, 0}, {0, 0}} {
			s := schedule.Schedule{Name: "n", Queue: "q", Cron: fmt.Sprintf("%d %d * * *", hm[1], hm[0]), TimeZone: zone}
			perDay := map[string]int{}
			at := time.Date(2026, 1, 1, 0, 0, 0, 0, loc).Add(-time.Second)
			end := time.Date(2028, 1, 1, 0, 0, 0, 0, loc)
			for {
				got, err := next(s, at)
				if err != nil {
					t.Fatal(err)
				}
				if !got.After(at) {
					t.Fatalf("%s %s: tick %v is not after %v", zone, s.Cron, got, at)
				}
				if !got.Before(end) {
					break
				}
				l := got.In(loc)
				if (l.Hour() != hm[0] || l.Minute() != hm[1]) && !inGap(loc, l, hm[0], hm[1]) {
					t.Errorf("%s %s: tick at %v", zone, s.Cron, l)
				}
				perDay[l.Format("2006-01-02")]++
				at = got
			}
			if len(perDay) != 730 {
				t.Errorf("%s %s: ticks on %d days of 2026-2027, want 730", zone, s.Cron, len(perDay))
			}
			for d, n := range perDay {
				if n != 1 {
					t.Errorf("%s %s: %d ticks on %s", zone, s.Cron, n, d)
				}
			}
		}
	}
}

// inGap reports whether l is the first instant after a gap that skipped h:m on
// l's date.
func inGap(loc *time.Location, l time.Time, h, m int) bool {
	before := l.Add(-time.Nanosecond)
	_, o1 := before.Zone()
	_, o2 := l.Zone()
	want := time.Date(l.Year(), l.Month(), l.Day(), h, m, 0, 0, time.UTC)
	wallBefore := asUTC(before)
	return o2 > o1 && wallBefore.Before(want) && !asUTC(l).Before(want)
}

// TestIntervalsIgnoreDaylightSaving: every and @every are absolute time, the
// same hour apart across both changes.
func TestIntervalsIgnoreDaylightSaving(t *testing.T) {
	t.Parallel()
	for _, s := range []schedule.Schedule{
		{Name: "e", Queue: "q", Every: time.Hour},
		{Name: "d", Queue: "q", Cron: "@every 1h", TimeZone: "America/New_York"},
	} {
		for _, day := range []string{"2026-03-08", "2026-11-01"} {
			at := local(t, day, 0, 0, -5)
			for range 6 {
				got, err := next(s, at)
				if err != nil {
					t.Fatal(err)
				}
				if d := got.Sub(at); d != time.Hour {
					t.Fatalf("%+v on %s: tick %v, %v after %v, want 1h", s, day, got, d, at)
				}
				at = got
			}
		}
	}
}
