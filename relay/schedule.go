package relay

import (
	"context"
	"fmt"

	"github.com/delayq/delayq/internal/schedrun"
	"github.com/delayq/delayq/outbox"
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
// at the commit), once, whatever other relays or clients running the same
// schedule do (internal/schedrun).
func (r *Relay) scheduleLoop(ctx context.Context) {
	ob, err := outbox.New(outbox.Config{Schema: r.cfg.Schema, NotifyChannel: r.cfg.NotifyChannel})
	if err == nil {
		var runner *schedrun.Runner
		if runner, err = schedrun.New(r.cfg.Schedules, ob, r.cfg.Logger); err == nil {
			runner.Run(ctx, r.pool, func(err error) {
				r.pgErr(errPostgres, "schedules", err) //nolint:errcheck // counted and logged
			}, r.cfg.BackoffMin, r.cfg.BackoffMax)
			return
		}
	}
	// Validated by New: not reached.
	r.cfg.Logger.Error("relay: schedules not run", "error", err.Error())
}
