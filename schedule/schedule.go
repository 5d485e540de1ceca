// Package schedule declares periodic tasks: cron expressions with time zones, or
// fixed intervals. Declare a schedule in Go beside the handler of its queue, typed
// (For: the queue's codec writes each tick's payload from a value of the queue's
// type, checked by its Validate), and give it to the worker's client
// (delayq.Client.Schedule); or in the YAML file a relay sidecar reads (Parse; `delayq
// relay --schedules FILE`), or in relay.Config.Schedules. Whoever runs a schedule
// (the worker's Run, a relay) enqueues each tick into the outbox a little before it
// falls due (Config.Lookahead), as an ordinary task whose id is the schedule's name
// and the tick's time ("nightly-report@20250501T010000Z"). The outbox's unique key
// (queue, task id) makes every tick exactly once however many processes run the
// same schedules, declared in Go or YAML: no leader is elected, and a process that
// enqueues a tick another enqueued already only meets a duplicate.
//
// Each runner keeps, per schedule, the last tick it evaluated in the table
// delayq_schedules (migration 00005; 00018 adds the time zone and the last tick
// actually enqueued, which `delayq schedules` and delayq.Client.Schedules show): it
// locks the schedule's row (FOR UPDATE SKIP LOCKED: a row another process holds is
// that process's work this round), enqueues the ticks up to now + Lookahead and
// advances the last tick in the same transaction. Ticks that fell due while no
// runner ran are missed; Schedule.Missed says what becomes of them: skipped (the
// default), or the most recent Schedule.CatchUp of them are enqueued at once, in
// tick order.
//
// A cron expression reads the wall clock of its time zone: a time that daylight
// saving skips runs once, at the first instant after the gap; a time it repeats
// runs once, at its first occurrence (internal/schedspec). Intervals count absolute
// time.
//
// Times are the database's clock (now() in the runner's transaction), so processes
// with skewed clocks agree; a tick's task runs at the tick's time by the Redis clock, as
// every delayq task does, never early. Time zones come from the binary's own copy
// of the tz database (time/tzdata), so they work in the distroless image too.
package schedule

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/delayq/delayq/internal/schedspec"
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
	// Payload is each tick's payload, as is: for a typed queue, let For write
	// it (a strict JSON handler refuses an empty payload, even of struct{}).
	Payload []byte
	// MaxAttempts of each tick's task; 0 means the outbox default.
	MaxAttempts int
	// Missed: Skip (the default) or CatchUp.
	Missed Missed
	// CatchUp is the most missed ticks enqueued with Missed CatchUp (1..1000;
	// default 1).
	CatchUp int
}

// Config is the schedules a relay runs and how it runs them (a delayq client runs
// the schedules declared on it with its Config.Relay's Lookahead and Grace, or the
// defaults). The zero value runs none.
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
	return compile(c.WithDefaults())
}

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

func compile(c Config) error {
	if c.Lookahead < time.Millisecond {
		return bad("Lookahead %v: at least 1ms", c.Lookahead)
	}
	if c.Grace < 0 {
		return bad("Grace %v: not negative", c.Grace)
	}
	seen := map[string]bool{}
	for _, s := range c.Schedules {
		if err := s.validate(); err != nil {
			return err
		}
		if seen[s.Name] {
			return bad("schedule %q declared twice", s.Name)
		}
		seen[s.Name] = true
	}
	return nil
}

// validate checks one schedule (its own fields; not the defaults of Config).
func (s Schedule) validate() error {
	if err := validate.Queue(s.Name); err != nil {
		return bad("name %q: 1..64 bytes of [A-Za-z0-9_.-]", s.Name)
	}
	if err := validate.Queue(s.Queue); err != nil {
		return bad("schedule %s: queue: %v", s.Name, err)
	}
	if len(s.Payload) > validate.DefaultMaxPayloadBytes {
		return bad("schedule %s: payload %d bytes, at most %d", s.Name, len(s.Payload), validate.DefaultMaxPayloadBytes)
	}
	if s.MaxAttempts < 0 || s.MaxAttempts > validate.MaxAttempts {
		return bad("schedule %s: max attempts %d: 0..%d", s.Name, s.MaxAttempts, validate.MaxAttempts)
	}
	switch s.Missed {
	case Skip, "":
		if s.CatchUp != 0 {
			return bad("schedule %s: catch-up %d with missed %q (set missed: catch-up)", s.Name, s.CatchUp, Skip)
		}
	case CatchUp:
		if s.CatchUp < 0 || s.CatchUp > 1000 {
			return bad("schedule %s: catch-up %d: 1..1000", s.Name, s.CatchUp)
		}
	default:
		return bad("schedule %s: missed %q: %q or %q", s.Name, s.Missed, Skip, CatchUp)
	}
	if _, err := schedspec.Compile(s.Cron, s.TimeZone, s.Every); err != nil {
		return bad("schedule %s: %v", s.Name, err)
	}
	// A tick's id must be a task id: name@time.
	if err := validate.TaskID(TaskID(s, time.Date(2000, 1, 1, 0, 0, 0, 1e6, time.UTC))); err != nil {
		return bad("schedule %s: %v", s.Name, err)
	}
	return nil
}

// TaskID is the task id of the tick of s at tick: the name, "@", and the tick's
// time as validate.TimeID writes it, with milliseconds only when s is an interval
// that is not a whole number of seconds; so the ids of a schedule sort in time
// order.
func TaskID(s Schedule, tick time.Time) string {
	return s.Name + "@" + validate.TimeID(tick, s.Every%time.Second != 0)
}

// ParseTaskID reads a tick's task id back into the schedule's name and the tick
// time (a handler learns which tick it runs); ok is false for any other id. It
// reads the id of a manual run of a schedule too (`delayq schedules run`, the
// dashboard's run now: "nightly-report@run-20261205T012345Z-9f8e7d6c5b4a3921",
// the name, "@run-", the time it was asked for and a nonce), with tick the time
// it was asked for (to the second): a handler runs it as a tick of then, and
// tells it from a tick by the "@run-" in its id.
func ParseTaskID(id string) (name string, tick time.Time, ok bool) {
	i := strings.LastIndexByte(id, '@')
	if i < 1 {
		return "", time.Time{}, false
	}
	if _, at, ok := schedspec.ParseRunID(id[i+1:]); ok {
		return id[:i], at, true
	}
	for _, layout := range []string{"20060102T150405Z", "20060102T150405.000Z"} {
		if t, err := time.Parse(layout, id[i+1:]); err == nil {
			return id[:i], t, true
		}
	}
	return "", time.Time{}, false
}

// Next returns the first tick of s strictly after t (zero when it has none within
// five years), or an error when s is invalid: to check a schedule's ticks in a
// test, across daylight saving say.
func Next(s Schedule, t time.Time) (time.Time, error) {
	if err := s.validate(); err != nil {
		return time.Time{}, err
	}
	spec, err := schedspec.Compile(s.Cron, s.TimeZone, s.Every)
	if err != nil { // validated: not reached
		return time.Time{}, bad("schedule %s: %v", s.Name, err)
	}
	return spec.Next(t), nil
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

// Parse reads a schedules file, as the relay's sidecar takes it (`delayq relay
// --schedules FILE`; YAML, unknown keys are errors):
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
