// Package relay is the bridge between the Postgres outbox and Redis: the
// long-running process a user deploys beside their service (the `delayq relay`
// command runs it with an HTTP admin server for metrics and health), or runs in
// the service's own process with delayq.Config.Relay. This package holds its
// Config; New, which takes the Redis side built by package delayq, is how the
// client and the command start it:
//
//	rl, err := relay.New(pool, dq.AsRedis(), relay.Config{Registerer: prometheus.DefaultRegisterer})
//	...
//	err = rl.Run(ctx) // until ctx ends; nil after finishing the round in hand
//
// # A round
//
// One transaction:
//
//	SELECT ... FROM delayq_outbox
//	WHERE state = 'pending' AND run_at < now() + horizon
//	ORDER BY run_at LIMIT batch FOR UPDATE SKIP LOCKED
//
// then one pipelined round trip of enqueue scripts to Redis (one call per queue
// and per EnqueueBatch tasks of the Redis side), then one UPDATE that marks the rows
// queued, then COMMIT. A full round is followed by the next at once, so a backlog
// drains at full speed. Otherwise the relay waits for a notification (producers
// pg_notify in their transaction, delivered at commit, on a connection of the
// relay's own), or until the next pending row comes within the horizon, at most
// Config.PollInterval. For Config.FollowUpFor (100ms) after every notification it
// runs follow-up rounds, the next at once after one that moved rows and
// Config.FollowUp (5ms) after one that found none: producers leave their
// notification out when one into the same queue has just notified and committed
// (outbox Config.NotifyCooldown), and these rounds move their tasks; a transaction
// that commits too late for them notifies at its commit.
//
// Rows due later than the horizon stay in Postgres: Redis memory follows the
// near-term load, not the whole backlog.
//
// # Failures
//
// A crash or an error between the Redis write and the commit leaves the rows
// pending: the next round moves them again, and the enqueue script reports them as
// duplicates, so Redis holds each task once. Several relays side by side share the
// rows through SKIP LOCKED; if two ever move the same row, the script makes it
// harmless.
//
// When Postgres or Redis cannot be reached the relay backs off with jitter
// (Config.BackoffMin..BackoffMax), logs once when a server goes down and once when
// it is back, and resumes by itself. A Redis restarted without persistence has
// lost what it held: rows committed while it was down arrive when it is back, and
// reconcile (`delayq reconcile`, or the client's Reconcile) restores the rows that were queued before.
//
// A row Redis would refuse (a payload over the delayq client's limit) is set dead
// with the reason, instead of failing every round it is in.
//
// # Reaper and retention
//
// Beside the rounds, Run takes back expired leases every Config.ReapInterval
// (the reap script, which reads the active ZSET only) for the queues in
// Config.Queues, or else those with queued rows. Tasks it declares dead are
// mirrored into Postgres (state dead, last error kept, guarded by version and
// state), so reconcile never revives them.
//
// Done and cancelled rows older than Config.Retention (the idempotency window,
// default 7 days) are deleted in batches of Config.RetentionBatch, each its own
// short transaction. Dead rows wait for a person.
//
// # Metrics
//
// See Metrics for the Prometheus collectors registered on Config.Registerer.
package relay
