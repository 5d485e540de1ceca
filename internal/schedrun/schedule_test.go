package schedrun

import (
	"testing"
	"time"

	"github.com/delayq/delayq/schedule"
)

// next is the first tick of s strictly after t.
func next(s schedule.Schedule, t time.Time) (time.Time, error) {
	spec, err := Compile(s)
	if err != nil {
		return time.Time{}, err
	}
	return spec.Next(t), nil
}

// asUTC returns the wall clock of t as a UTC time with the same fields.
func asUTC(t time.Time) time.Time {
	return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
}

func TestNextCronTimeZone(t *testing.T) {
	t.Parallel()
	s := schedule.Schedule{Name: "r", Queue: "q", Cron: "0 9 * * MON-FRI", TimeZone: "Europe/Paris"}
	// Friday 2025-03-28 10:00 Paris: next is Monday 2025-03-31 09:00 Paris, after the
	// switch to summer time (UTC+2): 07:00 UTC.
	at := time.Date(2025, 3, 28, 9, 0, 0, 0, time.UTC)
	got, err := next(s, at)
	if err != nil || !got.Equal(time.Date(2025, 3, 31, 7, 0, 0, 0, time.UTC)) {
		t.Fatalf("Next = %v, %v", got, err)
	}
	if id := schedule.TaskID(s, got); id != "r@20250331T070000Z" {
		t.Fatalf("TaskID = %q", id)
	}
	// Six fields: seconds first.
	got, _ = next(schedule.Schedule{Name: "s", Queue: "q", Cron: "*/15 * * * * *"}, time.Date(2025, 1, 1, 0, 0, 7, 0, time.UTC))
	if !got.Equal(time.Date(2025, 1, 1, 0, 0, 15, 0, time.UTC)) {
		t.Fatalf("seconds: %v", got)
	}
}

func TestNextEveryAligned(t *testing.T) {
	t.Parallel()
	s := schedule.Schedule{Name: "e", Queue: "q", Every: 1500 * time.Millisecond}
	at := time.UnixMilli(3001).UTC()
	got, _ := next(s, at)
	if got.UnixMilli() != 4500 {
		t.Fatalf("Next after 3001 ms = %d ms, want 4500 (epoch-aligned)", got.UnixMilli())
	}
	if got, _ := next(s, time.UnixMilli(4500)); got.UnixMilli() != 6000 {
		t.Fatalf("Next is strictly after: %d", got.UnixMilli())
	}
	if id := schedule.TaskID(s, got); id != "e@19700101T000004.500Z" {
		t.Fatalf("TaskID = %q", id)
	}
	name, tick, ok := schedule.ParseTaskID("e@19700101T000004.500Z")
	if !ok || name != "e" || tick.UnixMilli() != 4500 {
		t.Fatalf("ParseTaskID: %q %v %v", name, tick, ok)
	}
	for _, id := range []string{"e", "@20250101T000000Z", "e@2025", "order-7"} {
		if _, _, ok := schedule.ParseTaskID(id); ok {
			t.Errorf("schedule.ParseTaskID(%q) ok", id)
		}
	}
}

// TestTicks checks the missed-tick policies on the tick computation alone, for an
// interval (arithmetic) and a cron schedule (walked through).
func TestTicks(t *testing.T) {
	t.Parallel()
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name          string
		s             schedule.Schedule
		last, now     time.Time
		want          []time.Time
		missed        int
		newLast       time.Time
		lookahead, gr time.Duration
	}{
		{"on time", schedule.Schedule{Every: time.Minute}, base, base.Add(30 * time.Second),
			[]time.Time{base.Add(time.Minute)}, 0, base.Add(time.Minute), time.Minute, time.Minute},
		{"late within grace", schedule.Schedule{Every: time.Minute}, base, base.Add(90 * time.Second),
			[]time.Time{base.Add(time.Minute), base.Add(2 * time.Minute)}, 0, base.Add(2 * time.Minute), time.Minute, time.Minute},
		{"skip", schedule.Schedule{Every: time.Minute}, base, base.Add(10*time.Minute + 30*time.Second),
			[]time.Time{base.Add(10 * time.Minute), base.Add(11 * time.Minute)}, 9, base.Add(11 * time.Minute), 40 * time.Second, time.Minute},
		{"catch up 2", schedule.Schedule{Every: time.Minute, Missed: schedule.CatchUp, CatchUp: 2}, base, base.Add(10*time.Minute + 30*time.Second),
			[]time.Time{base.Add(8 * time.Minute), base.Add(9 * time.Minute), base.Add(10 * time.Minute), base.Add(11 * time.Minute)}, 7, base.Add(11 * time.Minute), 40 * time.Second, time.Minute},
		{"catch up more than missed", schedule.Schedule{Every: time.Minute, Missed: schedule.CatchUp, CatchUp: 50}, base, base.Add(3*time.Minute + 30*time.Second),
			[]time.Time{base.Add(time.Minute), base.Add(2 * time.Minute), base.Add(3 * time.Minute)}, 0, base.Add(3 * time.Minute), 10 * time.Second, 0},
		{"cron skip", schedule.Schedule{Cron: "* * * * *"}, base, base.Add(10*time.Minute + 30*time.Second),
			[]time.Time{base.Add(10 * time.Minute), base.Add(11 * time.Minute)}, 9, base.Add(11 * time.Minute), 40 * time.Second, time.Minute},
		{"cron catch up 2", schedule.Schedule{Cron: "* * * * *", Missed: schedule.CatchUp, CatchUp: 2}, base, base.Add(10*time.Minute + 30*time.Second),
			[]time.Time{base.Add(8 * time.Minute), base.Add(9 * time.Minute), base.Add(10 * time.Minute), base.Add(11 * time.Minute)}, 7, base.Add(11 * time.Minute), 40 * time.Second, time.Minute},
		{"nothing due", schedule.Schedule{Cron: "0 0 1 1 *"}, base, base.Add(time.Hour), nil, 0, base, time.Minute, time.Minute},
	} {
		c.s.Name, c.s.Queue = "n", "q"
		r := &Runner{cfg: schedule.Config{Lookahead: c.lookahead, Grace: c.gr}.WithDefaults()}
		spec, err := Compile(c.s)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		x := compiled{Schedule: c.s, spec: spec}
		ticks, missed, newLast := r.ticks(&x, c.last, c.now)
		if len(ticks) != len(c.want) || missed != c.missed || !newLast.Equal(c.newLast) {
			t.Errorf("%s: ticks %v, missed %d, last %v; want %v, %d, %v", c.name, ticks, missed, newLast, c.want, c.missed, c.newLast)
			continue
		}
		for i := range ticks {
			if !ticks[i].Equal(c.want[i]) {
				t.Errorf("%s: ticks %v, want %v", c.name, ticks, c.want)
				break
			}
		}
	}
}
