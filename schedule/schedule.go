// Package schedule declares periodic tasks: cron expressions with time zones, or
// fixed intervals. The relay enqueues each tick into the outbox a little before it
// falls due (Config.Lookahead), as an ordinary task whose id is the schedule's name
// and the tick's time ("nightly-report@20250501T010000Z"). The outbox's unique key
// (queue, task id) makes every tick exactly once however many relays run the same
// schedules: no leader is elected, and a relay that enqueues a tick another relay
// enqueued already only meets a duplicate.
//
// Each relay keeps, per schedule, the last tick enqueued in the table
// delayq_schedules (migration 00005): it locks the schedule's row (FOR UPDATE SKIP
// LOCKED: a row another relay holds is that relay's work this round), enqueues the
// ticks up to now + Lookahead and advances the last tick in the same transaction.
// Ticks that fell due while no relay ran are missed; Schedule.Missed says what
// becomes of them: skipped (the default), or the most recent Schedule.CatchUp of
// them are enqueued at once, in tick order.
//
// A cron expression reads the wall clock of its time zone: a time that daylight
// saving skips runs once, at the first instant after the gap; a time it repeats
// runs once, at its first occurrence (wallclock.go). Intervals count absolute time.
//
// Times are the database's clock (now() in the relay's transaction), so relays with
// skewed clocks agree; a tick's task runs at the tick's time by the Redis clock, as
// every delayq task does, never early. Time zones come from the binary's own copy
// of the tz database (time/tzdata), so they work in the distroless image too.
package schedule

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
	_ "time/tzdata" // zones work where the system has no tz database (distroless)

	"github.com/robfig/cron/v3"
	"go.yaml.in/yaml/v3"

	"github.com/delayq/delayq/internal/validate"
)

// ErrInvalid reports an invalid schedule or Config.
var ErrInvalid = errors.New("schedule: invalid")

// Missed is what becomes of ticks that fell due while no relay ran.
type Missed string

const (
	// Skip drops missed ticks (counted in the schedule's missed column): the
	// schedule goes on with the next tick. The default.
	Skip Missed = "skip"
	// CatchUp enqueues the most recent Schedule.CatchUp missed ticks at once, in
	// tick order (each due at its own, past, time: so at once); older ones are
	// dropped and counted as missed.
	CatchUp Missed = "catch-up"
)

// Defaults of Config, as its fields' comments state them.
const (
	defaultLookahead = 10 * time.Second
	defaultGrace     = time.Minute
)

// Schedule is one periodic task. Set Cron or Every, not both.
type Schedule struct {
	// Name identifies the schedule and prefixes its ticks' task ids: 1..64 bytes of
	// [A-Za-z0-9_.-], unique among the schedules of a database. Renaming a schedule
	// starts it afresh.
	Name string
	// Queue receives the ticks' tasks.
	Queue string
	// Cron is a cron expression: five fields (minute hour day-of-month month
	// day-of-week), or six with seconds first, or a descriptor (@hourly, @daily,
	// @every 90m, ...), as github.com/robfig/cron/v3 parses them.
	Cron string
	// TimeZone is the IANA zone Cron is read in ("Europe/Paris"). Default UTC.
	// Across daylight saving, a skipped time runs at the end of the gap and a
	// repeated one once, at its first occurrence.
	TimeZone string
	// Every is a fixed interval (at least 1ms, whole ms): ticks are at the Unix
	// epoch plus whole multiples of Every, so every relay computes the same ticks.
	Every time.Duration
	// Payload is each tick's payload, as is.
	Payload []byte
	// MaxAttempts of each tick's task; 0 means the outbox default.
	MaxAttempts int
	// Missed: Skip (the default) or CatchUp.
	Missed Missed
	// CatchUp is the most missed ticks enqueued with Missed CatchUp (1..1000;
	// default 1).
	CatchUp int
}

// Config is the schedules a relay runs and how it runs them. The zero value runs
// none.
type Config struct {
	Schedules []Schedule
	// Lookahead: ticks due within it are enqueued (the relay evaluates the
	// schedules every Lookahead/2), so that a tick is in Redis, and runs on time,
	// whatever the relay's poll interval. Default 10s.
	Lookahead time.Duration
	// Grace: a tick that fell due without being enqueued counts as missed once it
	// is this late (before that it is enqueued, late, whatever the policy). Default
	// 1m.
	Grace time.Duration
}

// WithDefaults fills in the zero fields.
func (c Config) WithDefaults() Config {
	if c.Lookahead == 0 {
		c.Lookahead = defaultLookahead
	}
	if c.Grace == 0 {
		c.Grace = defaultGrace
	}
	c.Schedules = slices.Clone(c.Schedules)
	for i := range c.Schedules {
		s := &c.Schedules[i]
		if s.Missed == "" {
			s.Missed = Skip
		}
		if s.CatchUp == 0 && s.Missed == CatchUp {
			s.CatchUp = 1
		}
	}
	return c
}

// Validate reports whether c, with its defaults, is valid.
func (c Config) Validate() error {
	_, err := compile(c.WithDefaults())
	return err
}

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// cronParser reads five fields, six with seconds, and descriptors.
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// compiled is a validated schedule with its tick function.
type compiled struct {
	Schedule
	spec string
	// next returns the first tick strictly after t (zero: none within five years).
	next func(t time.Time) time.Time
}

func compile(c Config) ([]compiled, error) {
	if c.Lookahead < time.Millisecond {
		return nil, bad("Lookahead %v: at least 1ms", c.Lookahead)
	}
	if c.Grace < 0 {
		return nil, bad("Grace %v: not negative", c.Grace)
	}
	out := make([]compiled, 0, len(c.Schedules))
	seen := map[string]bool{}
	for _, s := range c.Schedules {
		x, err := compileOne(s)
		if err != nil {
			return nil, err
		}
		if seen[s.Name] {
			return nil, bad("schedule %q declared twice", s.Name)
		}
		seen[s.Name] = true
		out = append(out, x)
	}
	return out, nil
}

func compileOne(s Schedule) (compiled, error) {
	if err := validate.Queue(s.Name); err != nil {
		return compiled{}, bad("name %q: 1..64 bytes of [A-Za-z0-9_.-]", s.Name)
	}
	if err := validate.Queue(s.Queue); err != nil {
		return compiled{}, bad("schedule %s: queue: %v", s.Name, err)
	}
	if len(s.Payload) > validate.DefaultMaxPayloadBytes {
		return compiled{}, bad("schedule %s: payload %d bytes, at most %d", s.Name, len(s.Payload), validate.DefaultMaxPayloadBytes)
	}
	if s.MaxAttempts < 0 || s.MaxAttempts > validate.MaxAttempts {
		return compiled{}, bad("schedule %s: max attempts %d: 0..%d", s.Name, s.MaxAttempts, validate.MaxAttempts)
	}
	switch s.Missed {
	case Skip, "":
		if s.CatchUp != 0 {
			return compiled{}, bad("schedule %s: catch-up %d with missed %q (set missed: catch-up)", s.Name, s.CatchUp, Skip)
		}
	case CatchUp:
		if s.CatchUp < 0 || s.CatchUp > 1000 {
			return compiled{}, bad("schedule %s: catch-up %d: 1..1000", s.Name, s.CatchUp)
		}
	default:
		return compiled{}, bad("schedule %s: missed %q: %q or %q", s.Name, s.Missed, Skip, CatchUp)
	}
	x := compiled{Schedule: s}
	switch {
	case s.Cron != "" && s.Every != 0:
		return compiled{}, bad("schedule %s: both cron and every; set one", s.Name)
	case s.Every != 0:
		if s.TimeZone != "" {
			return compiled{}, bad("schedule %s: a time zone applies to cron only", s.Name)
		}
		if s.Every < time.Millisecond || s.Every%time.Millisecond != 0 {
			return compiled{}, bad("schedule %s: every %v: a whole number of ms, at least 1ms", s.Name, s.Every)
		}
		every := s.Every.Milliseconds()
		x.spec = "every " + s.Every.String()
		x.next = func(t time.Time) time.Time {
			ms := t.UnixMilli()
			n := ms - mod(ms, every) + every
			return time.UnixMilli(n).UTC()
		}
	case s.Cron != "":
		if strings.HasPrefix(s.Cron, "TZ=") || strings.HasPrefix(s.Cron, "CRON_TZ=") {
			return compiled{}, bad("schedule %s: give the zone as the time zone, not in the cron expression", s.Name)
		}
		loc := time.UTC
		if s.TimeZone != "" {
			var err error
			if loc, err = time.LoadLocation(s.TimeZone); err != nil {
				return compiled{}, bad("schedule %s: time zone %q: %v", s.Name, s.TimeZone, err)
			}
		}
		cs, err := cronParser.Parse(s.Cron)
		if err != nil {
			return compiled{}, bad("schedule %s: cron %q: %v", s.Name, s.Cron, err)
		}
		x.spec = "cron " + s.Cron
		if s.TimeZone != "" {
			x.spec += " (" + s.TimeZone + ")"
		}
		if spec, ok := cs.(*cron.SpecSchedule); ok {
			// Fields are matched on the zone's wall clock (wallclock.go): a copy
			// that reads its times as given, in UTC.
			wall := *spec
			wall.Location = time.UTC
			x.next = func(t time.Time) time.Time { return wallNext(&wall, loc, t) }
			break
		}
		// @every: an interval, absolute time, whatever the zone.
		x.next = func(t time.Time) time.Time {
			n := cs.Next(t.In(loc))
			if n.IsZero() {
				return n
			}
			return n.UTC()
		}
	default:
		return compiled{}, bad("schedule %s: neither cron nor every", s.Name)
	}
	// A tick's id must be a task id: name@time.
	if err := validate.TaskID(TaskID(s, time.Date(2000, 1, 1, 0, 0, 0, 1e6, time.UTC))); err != nil {
		return compiled{}, bad("schedule %s: %v", s.Name, err)
	}
	return x, nil
}

func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// TaskID is the task id of the tick of s at tick: the name, "@", and the tick's
// time as validate.TimeID writes it, with milliseconds only when s is an interval
// that is not a whole number of seconds; so the ids of a schedule sort in time
// order.
func TaskID(s Schedule, tick time.Time) string {
	return s.Name + "@" + validate.TimeID(tick, s.Every%time.Second != 0)
}

// ParseTaskID reads a tick's task id back into the schedule's name and the tick
// time (a handler learns which tick it runs); ok is false for any other id.
func ParseTaskID(id string) (name string, tick time.Time, ok bool) {
	i := strings.LastIndexByte(id, '@')
	if i < 1 {
		return "", time.Time{}, false
	}
	for _, layout := range []string{"20060102T150405Z", "20060102T150405.000Z"} {
		if t, err := time.Parse(layout, id[i+1:]); err == nil {
			return id[:i], t, true
		}
	}
	return "", time.Time{}, false
}

// Next returns the first tick of s strictly after t (zero when it has none within
// five years), or an error when s is invalid.
func Next(s Schedule, t time.Time) (time.Time, error) {
	x, err := compileOne(s)
	if err != nil {
		return time.Time{}, err
	}
	return x.next(t), nil
}

// Spec describes s as the schedules table and `delayq schedules` show it.
func Spec(s Schedule) (string, error) {
	x, err := compileOne(s)
	if err != nil {
		return "", err
	}
	return x.spec, nil
}

// fileConfig is the file the relay reads (delayq relay --schedules FILE).
type fileConfig struct {
	Lookahead time.Duration `yaml:"lookahead"`
	Grace     time.Duration `yaml:"grace"`
	Schedules []struct {
		Name        string        `yaml:"name"`
		Queue       string        `yaml:"queue"`
		Cron        string        `yaml:"cron"`
		TimeZone    string        `yaml:"timezone"`
		Every       time.Duration `yaml:"every"`
		Payload     string        `yaml:"payload"`
		MaxAttempts int           `yaml:"max_attempts"`
		Missed      Missed        `yaml:"missed"`
		CatchUp     int           `yaml:"catch_up"`
	} `yaml:"schedules"`
}

// Parse reads a schedules file (YAML; unknown keys are errors):
//
//	lookahead: 10s            # optional, Config.Lookahead
//	grace: 1m                 # optional, Config.Grace
//	schedules:
//	  - name: nightly-report
//	    queue: reports
//	    cron: "0 3 * * *"
//	    timezone: Europe/Paris
//	    payload: '{"kind":"nightly"}'
//	    missed: catch-up      # or skip (the default)
//	    catch_up: 1
//	  - name: heartbeat
//	    queue: ops
//	    every: 30s
//	    max_attempts: 3
func Parse(b []byte) (Config, error) {
	var f fileConfig
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, bad("%v", err)
	}
	c := Config{Lookahead: f.Lookahead, Grace: f.Grace}
	for _, s := range f.Schedules {
		c.Schedules = append(c.Schedules, Schedule{
			Name: s.Name, Queue: s.Queue, Cron: s.Cron, TimeZone: s.TimeZone, Every: s.Every,
			Payload: []byte(s.Payload), MaxAttempts: s.MaxAttempts, Missed: s.Missed, CatchUp: s.CatchUp,
		})
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Load reads the schedules file at path (see Parse).
func Load(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("schedule: %w", err)
	}
	c, err := Parse(b)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
