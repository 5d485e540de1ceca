// Package workflow runs tasks after other tasks: a task enqueued waiting on
// its dependencies (Client.Enqueue), and chains of tasks each waiting on the
// one before (Client.Chain), enqueued in the caller's transaction with the
// outbox client (package outbox, or delayq.Client, which holds one). A
// transactional handler may store a small result with its completion
// (Client.SetResult), which its dependents read (Client.Result).
//
// A waiting task stays in PostgreSQL in the state waiting
// (delayqtype.StateWaiting), which the relay leaves alone. The transition that
// finishes its last dependency — a worker's completion in the handler's own
// transaction, a death, a cancel — also releases it, in that same transaction:
// the task becomes pending, due at its own run time (at once if that passed),
// and the relay is notified at the commit. There is no scan and no leader; the
// release commits exactly once, together with the last dependency's effect,
// or not at all (docs/DESIGN.md, "Workflows").
//
// A dependency that ends dead or cancelled is handled as its Policy says: Fail
// (the default) makes the dependent dead with the reason (and hands it to its
// queue's OnDead hook), Skip cancels it with the reason, Run runs it anyway.
// A dependent failed or skipped so passes the same to its own dependents, in
// the same transaction: a chain stops at once.
//
// A dependency must exist when its dependent is enqueued: enqueued earlier, or
// in the same transaction before it. So no cycle can form; a task named as its
// own dependency, or twice in one chain, is ErrCycle. A dependency already
// finished counts at once. A dependency without a row (never enqueued, or its
// row pruned by the retention) is ErrUnknownDependency, and nothing is written.
//
// Cancelling a waiting task (outbox.Client.Cancel) settles its dependents as
// their policies say; rescheduling it (outbox.Client.Reschedule) changes its
// run time, and it keeps waiting. A dead dependent retried by an operator runs
// without waiting again.
package workflow
