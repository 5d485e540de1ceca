package relay

import (
	"context"
	"fmt"

	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/schedule"
)

// This file hooks the scheduling features of package schedule into the relay: the
// loop that enqueues the ticks of Config.Schedules, and the mirror of the queue
// controls (pause; queues.go). Run starts what featureLoops returns.

// validateFeatures checks Config.Schedules (for Config.validate).
func (c Config) validateFeatures() error {
	if err := c.Schedules.Validate(); err != nil {
		return fmt.Errorf("%w: Schedules: %w", ErrInvalidConfig, err)
	}
	return nil
}

// featureLoops returns the loops of the scheduling features: the schedules' loop
// when there are schedules, and the queue controls' mirror.
func (r *Relay) featureLoops() []func(context.Context) {
	loops := []func(context.Context){r.controlLoop} // queues.go
	if len(r.cfg.Schedules.Schedules) > 0 {
		loops = append(loops, r.scheduleLoop)
	}
	return loops
}

// scheduleLoop evaluates the schedules every Lookahead/2: each tick due within the
// lookahead is enqueued into the outbox (the relay's own rounds then move it, woken
// at the commit), once, whatever other relays do (package schedule).
func (r *Relay) scheduleLoop(ctx context.Context) {
	ob, err := outbox.New(outbox.Config{Schema: r.cfg.Schema, NotifyChannel: r.cfg.NotifyChannel})
	if err == nil {
		var runner *schedule.Runner
		if runner, err = schedule.NewRunner(r.cfg.Schedules, ob, r.cfg.Logger); err == nil {
			r.runSchedules(ctx, runner)
			return
		}
	}
	// Validated by New: not reached.
	r.cfg.Logger.Error("relay: schedules not run", "error", err.Error())
}

func (r *Relay) runSchedules(ctx context.Context, runner *schedule.Runner) {
	bo := newBackoff(r.cfg.BackoffMin, r.cfg.BackoffMax)
	for ctx.Err() == nil {
		wait := runner.Wait()
		if err := runner.RunOnce(ctx, r.pool); err != nil {
			if ctx.Err() != nil {
				return
			}
			r.pgErr(errPostgres, "schedules", err) //nolint:errcheck // counted and logged
			wait = min(wait, bo.next())
		} else {
			bo.reset()
		}
		if !sleep(ctx, wait) {
			return
		}
	}
}
