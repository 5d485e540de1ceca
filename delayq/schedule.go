package delayq

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/schedrun"
	"github.com/delayq/delayq/schedule"
)

// Schedule declares periodic schedules on c, beside its handlers, for Run to
// run: typed ones (schedule.For) or raw. Run enqueues their ticks in this
// process, whether or not it runs the relay (Config.Relay), and, as every
// runner of a schedule does, once per tick across every process and relay
// running the same schedule (the same name, as a relay's YAML may declare it
// too). Each is checked at once; a name declared on c before, or in
// Config.Relay.Schedules differently, is refused (schedule.ErrInvalid; none of
// s is kept). One declared identically in Config.Relay.Schedules is run by the
// relay alone. Declare before Run.
func (c *Client) Schedule(s ...schedule.Schedule) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		return ErrRunning
	}
	all := append(append([]schedule.Schedule(nil), c.schedules...), s...)
	if err := (schedule.Config{Schedules: all}).Validate(); err != nil {
		return err
	}
	if c.cfg.Relay != nil {
		for _, x := range s {
			for _, y := range c.cfg.Relay.Schedules.Schedules {
				if x.Name == y.Name && !sameSchedule(x, y) {
					return fmt.Errorf("%w: schedule %s: declared differently in Config.Relay.Schedules", schedule.ErrInvalid, x.Name)
				}
			}
		}
	}
	c.schedules = all
	return nil
}

// sameSchedule reports whether a and b declare the same schedule (defaults
// applied).
func sameSchedule(a, b schedule.Schedule) bool {
	d := schedule.Config{Schedules: []schedule.Schedule{a, b}}.WithDefaults().Schedules
	a, b = d[0], d[1]
	return a.Name == b.Name && a.Queue == b.Queue && a.Cron == b.Cron && a.TimeZone == b.TimeZone &&
		a.Every == b.Every && bytes.Equal(a.Payload, b.Payload) && a.MaxAttempts == b.MaxAttempts &&
		a.Missed == b.Missed && a.CatchUp == b.CatchUp
}

// ownSchedules returns the schedules Run runs itself: those declared on c that
// the in-process relay does not run. c.mu is held.
func (c *Client) ownSchedules() schedule.Config { return c.ownSchedulesOf(c.schedules) }

// ownSchedulesOf returns those of declared that the in-process relay does not
// run.
func (c *Client) ownSchedulesOf(declared []schedule.Schedule) schedule.Config {
	cfg := schedule.Config{}
	if c.cfg.Relay != nil { // the same lookahead and grace as the relay's
		cfg.Lookahead, cfg.Grace = c.cfg.Relay.Schedules.Lookahead, c.cfg.Relay.Schedules.Grace
	}
next:
	for _, s := range declared {
		if c.cfg.Relay != nil {
			for _, y := range c.cfg.Relay.Schedules.Schedules {
				if y.Name == s.Name {
					continue next
				}
			}
		}
		cfg.Schedules = append(cfg.Schedules, s)
	}
	return cfg
}

// The backoff of a failed round, as the relay's default.
const (
	scheduleBackoffMin = 100 * time.Millisecond
	scheduleBackoffMax = 5 * time.Second
)

// runSchedules runs the schedules of cfg until ctx ends; an error of a round is
// logged, and the round retried.
func (c *Client) runSchedules(cfg schedule.Config) (func(context.Context) error, error) {
	runner, err := schedrun.New(cfg, c.ob, c.cfg.Logger)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		if err := c.ob.CheckMigrated(ctx, c.pool); err != nil {
			return err
		}
		runner.Run(ctx, c.pool, func(err error) {
			c.cfg.Logger.Error("delayq: schedules", "error", err.Error())
		}, scheduleBackoffMin, scheduleBackoffMax)
		return nil
	}, nil
}

// Schedules lists every schedule run on c's database (by any relay or client),
// by name, with its last tick enqueued and its next one, then those declared
// on c (or in Config.Relay.Schedules) that no process ran yet.
func (c *Client) Schedules(ctx context.Context) ([]delayqtype.ScheduleState, error) {
	c.mu.Lock()
	declared := c.schedules
	c.mu.Unlock()
	if c.cfg.Relay != nil {
		declared = append(c.ownSchedulesOf(declared).Schedules, c.cfg.Relay.Schedules.Schedules...)
	}
	return classified(schedrun.List(ctx, c.pool, c.cfg.Schema, declared))
}
