// Package delayq runs delayed tasks for a Go service on PostgreSQL and Redis:
// a task is enqueued inside the service's own transaction (it exists if and
// only if that transaction commits), moved to Redis shortly before it is due,
// claimed on time by a worker, and its completion is recorded in PostgreSQL in
// the handler's own transaction, so that its effect happens exactly once.
//
// One Client does it all: it migrates, enqueues, runs the handlers and the
// periodic schedules declared beside them (Client.Schedule, schedule.For), and,
// as an option, the relay in the same process, and carries the operator's
// calls.
//
//	type Charge struct{ Order string; AmountCents int }
//	var Charges = outbox.Queue[Charge]{Name: "charge"} // producers and workers share it
//
//	client, err := delayq.New(pool, rdb, delayq.Config{Relay: &relay.Config{}})
//	err = client.Migrate(ctx)
//	err = delayq.RegisterTx(client, Charges, func(ctx context.Context, tx pgx.Tx, t *delayq.Task, c Charge) error {
//		_, err := tx.Exec(ctx, `INSERT INTO payments (order_id, cents) VALUES ($1, $2)`, c.Order, c.AmountCents)
//		return err // committed with the task's completion: exactly once
//	}, delayq.QueueConfig{Concurrency: 20})
//
//	// in the business transaction:
//	_, err = Charges.Enqueue(ctx, client, tx, outbox.Task{ID: order, Delay: 30 * time.Minute}, Charge{order, 4200})
//
//	err = client.Run(ctx) // until ctx is cancelled, then a graceful shutdown
//
// Services that only produce need no Redis: package outbox enqueues alone.
// Large deployments run the relay as its own process (the delayq relay
// command) and leave Config.Relay nil. The operator's calls (Pause, Resume,
// SetRateLimit, Cancel, Reschedule, RetryDead, PurgeDead, Stats, Check,
// Reconcile) write PostgreSQL first and Redis after, through the same
// operations as the workers (docs/DESIGN.md).
//
// # Typed handlers
//
// An outbox.Queue[T] names a queue and the type of its payloads, and is shared by
// producers (Queue.Enqueue) and handlers (Register, RegisterTx, RegisterSQL): the handler gets
// the decoded T. JSON is the default codec; a Queue may name another
// (outbox.Codec). A payload that does not decode makes the task dead at once,
// with the reason as its last error: the default JSON codec is strict (a field
// T lacks, or data after the JSON value, does not decode; see outbox.JSONCodec
// for the lenient option), and a T with a Validate() error method is checked
// after decoding too. Registering a handler binds T to the queue name on the
// client: enqueueing a value of another type for the queue through the client
// is refused (outbox.ErrQueueType), as is a second handler for a queue.
//
// # database/sql
//
// RegisterSQL registers a transactional handler that gets a
// *sql.Tx begun on the *sql.DB it is given (pgx's stdlib driver, or another
// Postgres driver), for sqlx, GORM or ent code: the guard runs in that
// transaction and commits with the handler's writes, as for RegisterTx.
//
// # Middleware
//
// A Middleware wraps every run of a handler, plain or transactional: logging,
// tracing, metrics, timeouts, panics. WorkerConfig.Middleware wraps every queue,
// QueueConfig.Middleware one queue, inside the worker's. The built-ins are
// middleware too: Recover (always the outermost, with WorkerConfig.Logger), Timeout and
// Logging. A middleware that returns an error fails the run, and what a
// transactional handler wrote is rolled back.
//
// # Two kinds of handlers
//
// A transactional handler (RegisterTx) gets a pgx.Tx of the worker's. After the
// handler returns nil, the worker runs the completion guard (outbox.MarkDone's) in
// the same transaction and commits, both in one round trip: the handler's writes
// and "task done" commit together or not at all (a guard that matches nothing
// raises an error, which aborts the transaction before the COMMIT). BEGIN costs no
// round trip of its own: it goes to Postgres with the handler's first Exec, Query,
// QueryRow or SendBatch (with one INSERT, a task takes two round trips in all; a
// pgx tracer sees that first statement in a batch), and a handler that wrote
// nothing leaves the guard to commit alone. Otherwise the transaction behaves as
// one from pool.Begin: Prepare, CopyFrom, a prepared statement's name, savepoints
// and large objects begin it first, and a first statement that fails before BEGIN
// ran is sent again inside it, so that its error aborts the transaction. The handler
// must not end the transaction: Commit and Rollback return ErrTxOwned and fail the
// run. The guard matches only a row that is still pending or queued at the claimed
// version (pending belongs there: a worker can claim a task before the relay that
// moved it to Redis has committed, and that relay may roll back). When it matches
// nothing, someone has finished the task already (a lease that expired under a
// slow worker, an ack lost after a commit, a relay that ran twice) or it was
// cancelled: the worker rolls back, counts a suppressed duplicate and acknowledges
// Redis.
//
// # Group commit
//
// With QueueConfig.GroupCommit, a transactional queue runs several due tasks in
// one Postgres transaction: one after another on one connection, each handler's
// writes inside a savepoint of its own that its first statement opens (a handler
// that writes nothing sends nothing). The completion guards of the whole group go
// in one statement with the COMMIT, so a group of handlers that write nothing
// costs one round trip. A handler that fails, panics or leaves the transaction
// aborted rolls back to its own savepoint, and its task is retried as usual; the
// others commit together, with one commit for up to GroupCommit.MaxTasks tasks (at
// most 64), and are acknowledged in Redis with one call. When the guard of a task
// that wrote refuses (the task finished, was cancelled or rescheduled meanwhile),
// nothing of the group commits: the group is rolled back and the other handlers
// that wrote run again, in the same attempt, without that task. A group takes
// more tasks for GroupCommit.MaxWait (2ms) after its first began. When the commit
// fails, or its outcome is lost, every run of the group is recorded as failed,
// which the outbox refuses for a task whose completion did commit. It suits short
// handlers whose writes hold no contended locks: the rows a handler locks stay
// locked until its group commits.
//
// A plain handler (Register) is for effects outside Postgres, such as an HTTP call.
// It runs at least once; the completion is still recorded in the outbox after it
// returns nil. Pass Task.IdempotencyKey to the external system so that it applies
// the effect once.
//
// Finished runs are settled in batches without a timer: the completions of plain
// runs go to Postgres in one guarded UPDATE and one commit for all that finished
// while the previous batch was written, and successful runs of both kinds are
// acknowledged in Redis with one script call per queue (the complete-many script). A
// successful run is handed to these stages, which end it: its goroutine returns
// to the pool at once, without waiting for the commit or the acknowledgement.
//
// # Leases and heartbeats
//
// A claim leases the task for WorkerConfig.Lease (default 5s). While the handler runs,
// the worker renews the lease every WorkerConfig.HeartbeatInterval (default a third of
// the lease): one heartbeat loop per worker renews all its leases of a queue with
// one script call (the extend-many script), each between half an interval and an
// interval after its previous renewal. When a renewal is refused (the lease expired and was reaped, the task
// was rescheduled or removed) or cannot be made before the lease runs out, the
// handler's context is cancelled with cause ErrLeaseLost (see context.Cause). A
// worker that dies holds its tasks until their lease expires and the reaper (run by
// the relay) gives them back.
//
// # Failures, backoff, dead tasks
//
// A handler that returns an error or panics (the panic is recovered; its stack is
// logged, and kept in the task's attempt history) has failed. The worker records the
// attempt and a short error summary in the outbox, and appends the run to the task's
// attempt history (Client.Attempts: the newest 20 runs that did not succeed, with
// their errors and a panic's stack, kept on the outbox row and deleted with it;
// a success writes nothing there), then gives the task back to Redis to run
// again after the queue's Backoff: exponential from Base, capped at Max, with equal
// jitter. A handler steers this with RetryAfter(d, err) (retry after d) and
// NoRetry(err) (dead at once). A task that fails its last attempt
// (QueueConfig.MaxAttempts, or the task's own limit) is dead: first in Postgres,
// then in Redis, with its last error; it never runs again by itself.
// QueueConfig.Retry replaces the backoff with a function of the attempt and the
// error, which may also stop the retries.
//
// # Hooks, snooze and cancel
//
// QueueConfig.OnDead runs in the Postgres transaction that records the task's
// death: "mark the order payment_failed" commits with the death, exactly once.
// A hook that fails rolls the death back and the task fails again later (see
// DeadHook). A death the relay records (a crash on the last attempt, a row Redis
// refuses) is marked, and the worker's sweep runs the hook later, exactly once. WorkerConfig.OnError sees every failure with what the worker does about
// it. From inside a handler, Snooze(d) runs the task again after d without
// counting the run, and Cancel(err) finishes it without effect, recorded as
// cancelled; both roll back a transactional handler's writes.
//
// # Shutdown
//
// When Run's context is cancelled, the worker stops claiming and lets the handlers
// in flight finish within WorkerConfig.ShutdownTimeout. Then it cancels their contexts
// (cause ErrShutdown), waits for them to return, rolls their transactions back and
// gives their leases back (the release script): those tasks run again at once,
// elsewhere, and the interrupted run does not count as an attempt.
//
// # Claiming
//
// Each queue claims as many tasks as it has free handler slots
// (QueueConfig.Concurrency) in one script call, again as soon as a slot frees while
// tasks are due. While a queue has a backlog (its last claim left tasks due), a
// claim waits up to 1 ms for a quarter of its slots to come free, so that handlers
// ending one by one do not turn the backlog into a claim per task; a due task
// waits at most that long, and only behind older due tasks. (Queues of a
// PriorityGroup claim for the group's free slots without this wait.) When none is due, it sleeps until the next one falls due by the
// Redis clock, or until an earlier one is enqueued (a Redis pub/sub wake-up): there is no
// polling interval. A long sleep ends a little early (50, then 10, then 2 ms before
// the due time) with a claim that finds nothing due yet, so that the claim at the
// due time does not pay for waking an idle machine; no task is ever claimed early.
//
// # Observability
//
// Each process running handlers registers itself in Redis while Run runs (host,
// pid, version, queues, the runs in flight; a heartbeat every Lease/3, gone when
// Run returns, listed as lost a lease after its last beat if it died):
// Client.Workers lists them, as do the delayq workers command and the dashboard's
// Workers page.
//
// Client.RunStats returns the counts of its handlers. WorkerConfig.Observer
// receives every claim and every run's start and end (an Observer, in the manner
// of pgx's tracers: package delayqotel's traces one). With Config.Registerer
// set, the worker also registers
// its Prometheus observer's collectors, labelled by queue:
//
//	delayq_worker_tasks_total{queue,outcome} outcome: claimed, succeeded, failed, retried,
//	                                         dead, suppressed_duplicate, lease_lost, released,
//	                                         snoozed, cancelled
//	delayq_worker_in_flight{queue}
//	delayq_worker_claim_lateness_seconds{queue}  claim time - due time, Redis clock
//	delayq_worker_processing_seconds{queue}      handler start to end of its bookkeeping
//	delayq_worker_swept_dead_hooks_total{queue,result}  OnDead hooks run by the sweep for
//	                                         deaths recorded without them: ran, failed
//
// # Sensitive payloads
//
// Redis drops a task's payload when it is completed. QueueConfig.ClearPayload also
// empties it in the outbox row, in the transaction that marks the task done (for a
// whole outbox, see outbox.Config.ClearPayloadOnDone). Dead tasks keep theirs so
// that a person can run them again.
package delayq
