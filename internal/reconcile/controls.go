package reconcile

import (
	"context"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/queuectl"
)

// RestoreControls is the repair of Redis's copy of the queue controls (pause,
// rate limit, shard count): it writes every queue's controls from the outbox's
// delayq_queues table into Redis, each at its version, so it never undoes a
// newer change (queuectl.Restore, the copy's one writer besides the control
// operations). It returns how many Redis was behind on (restored; with
// Options.DryRun, found and left). An outbox not migrated to 00004 has no
// controls: 0, nil. The relay runs it every the relay's queuectl.SyncInterval,
// Reconcile once per run.
func RestoreControls(ctx context.Context, db DB, dq *dispatch.Client, opts Options) (int, error) {
	o, _, err := opts.prepare()
	if err != nil {
		return 0, err
	}
	return queuectl.Restore(ctx, db, dq, o.Schema, o.DryRun)
}
