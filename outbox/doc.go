// Package outbox is the producer side of delayq: it writes delayed tasks into the
// Postgres outbox table inside the caller's own transaction, so that a task exists if,
// and only if, the business change that asked for it commits.
//
//	client, err := outbox.New(outbox.Config{})
//	...
//	tx, err := pool.Begin(ctx)
//	... // the service's own writes
//	res, err := client.Enqueue(ctx, tx, outbox.Task{
//		Queue: "payment", ID: "order-1001", Payload: payload, Delay: 30 * time.Minute,
//	})
//	... // res.Duplicate: this order was enqueued before; nothing was written
//	err = tx.Commit(ctx) // the relay is woken now, never before
//
// The package talks to Postgres only: the relay (package relay) moves due rows into
// Redis, workers run them. It does not import the Redis client.
//
// # Identity and duplicates
//
// (Queue, ID) is the business identity of a task and the primary key of the outbox. A
// second enqueue of the same identity, while the first row is kept (see the retention
// of finished rows), inserts nothing and is reported as Result.Duplicate. It is not an
// error and does not abort the caller's transaction (INSERT ... ON CONFLICT DO NOTHING).
// To run the same action again after it is done, enqueue a new id, e.g. with a round
// suffix.
//
// # Transactions
//
// Every call takes the Querier to run on: a pgx.Tx, *pgxpool.Pool, *pgxpool.Conn or
// *pgx.Conn. Services on database/sql (or sqlx, GORM) use EnqueueSQL and EnqueueManySQL
// with their *sql.Tx; EnqueueManySQL needs the pgx driver (pgx/v5/stdlib).
//
// Enqueue sends pg_notify on Config.NotifyChannel in the same statement for a task due
// within Config.NotifyWithin (30s): Postgres delivers it when the transaction commits
// and drops it when it rolls back, so the relay wakes exactly for committed work. Tasks
// due later are found by the relay's next round; that keeps most producers' commits
// free of the serialization Postgres imposes on notifying transactions.
//
// Near-due tasks do not pay it at every commit either: an Enqueue leaves its
// notification out when an earlier Enqueue of the same Client into the same queue
// notified less than Config.NotifyCooldown (25ms) before and its transaction has
// committed, which the statement itself checks (that enqueue's row is visible to it:
// committed, and not rolled back to a savepoint; no round trip). That
// commit woke the relays, which run follow-up rounds for their FollowUpFor (100ms)
// after every wake-up and move this task too. A notifier still in progress or rolled
// back covers nothing: the enqueue notifies. A transaction whose enqueue left its
// notification out notifies at its commit after all when that commit comes 25ms or
// more after the transaction began (a trigger of migration 00015), too late for those
// rounds. So every committed near-due task wakes a relay at its commit, or is moved by
// a follow-up round after it, however long its transaction stays open.
// EnqueueMany, Reschedule and dead retries notify at every commit. NotifyCooldown -1
// notifies at every commit.
//
// # Validation
//
// Bad input is refused before anything is sent, with an error that wraps one of
// ErrInvalidQueue, ErrInvalidTaskID, ErrInvalidTask or ErrPayloadTooLarge: test
// with errors.Is. Queue names and task ids follow the
// rules that keep them safe inside Redis keys and their {queue} hash tag (see Task). The
// default payload limit is 64 KiB (Config.MaxPayloadBytes).
//
// # States
//
// A task's row goes pending → queued → done | dead | cancelled; Reschedule makes it
// pending again as a new version. The states and every transition, with who makes
// it and the order of its Postgres and Redis writes, are in docs/DESIGN.md. Workers
// complete a task with a guard that changes the row only while it is pending or
// queued at the version they claimed, so a task is completed at most once even when
// leases expire or relays repeat themselves.
package outbox
