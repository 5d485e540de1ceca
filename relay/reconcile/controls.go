package reconcile

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/taskstate"
)

// RestoreControls mirrors every queue's controls (pause, rate limit, shard count)
// from the outbox's delayq_queues table into Redis, each keyed by its version, so
// it never undoes a newer change. It returns how many Redis was behind on
// (restored; with Options.DryRun, found and left). An outbox not migrated to
// 00004 has no controls: 0, nil. The relay runs it every
// relay.ControlSyncInterval, Reconcile once per run.
func RestoreControls(ctx context.Context, db DB, dq *delayq.Client, opts Options) (int, error) {
	o, _, err := opts.prepare()
	if err != nil {
		return 0, err
	}
	ctls, err := taskstate.New(taskstate.Config{Schema: o.Schema}).QueueControls(ctx, db)
	if err != nil {
		if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "42P01" { // undefined_table
			return 0, nil
		}
		return 0, err
	}
	n := 0
	for _, c := range ctls {
		if o.DryRun {
			_, v, err := dq.Controls(ctx, c.Queue)
			if err != nil {
				return n, err
			}
			if v < c.Version {
				n++
			}
			continue
		}
		applied, err := dq.SetControls(ctx, c.Queue, c.Version, delayq.Controls{Paused: c.Paused, Rate: c.Rate, Shards: c.Shards})
		if err != nil {
			return n, err
		}
		if applied {
			n++
		}
	}
	return n, nil
}
