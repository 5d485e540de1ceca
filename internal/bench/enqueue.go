package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
)

// registry lists the workloads by name.
func registry() map[string]workload {
	return map[string]workload{
		"enqueue-tx":           {"20,000 tasks due in 1 h, 8 producers, each task in its own transaction", enqueueTx(time.Hour, 0)},
		"enqueue-tx-soon":      {"enqueue-tx, but due in 10 s: within the notify window, notifications coalesced (NotifyCooldown 25 ms)", enqueueTx(10*time.Second, 0)},
		"enqueue-tx-soon-each": {"enqueue-tx-soon with a notification at every commit (NotifyCooldown -1)", enqueueTx(10*time.Second, -1)},
		"enqueue-tx-held":      {"12 bursts of a notifying commit, then 32 transactions that each enqueue a task due in 2 s and stay open 0-2 s; traffic stops after each: lag commit→Redis, default outbox and relay", enqueueTxHeld(true)},
		"enqueue-tx-held-off":  {"enqueue-tx-held with migration 00015's late-commit trigger disabled: the stranding before it (run only by name)", enqueueTxHeld(false)},
		"enqueue-batch":        {"100,000 tasks due in 1 h with EnqueueMany, batches of 10,000", enqueueBatch},
		"enqueue-tx-sql":       {"enqueue-tx through the SQL API (delayq_enqueue)", enqueueTxSQL(time.Hour)},
		"enqueue-tx-soon-sql":  {"enqueue-tx-soon through the SQL API (delayq_enqueue, its cooldown shared by the sessions)", enqueueTxSQL(10 * time.Second)},
		"enqueue-batch-sql":    {"enqueue-batch through the SQL API (delayq_enqueue_many)", enqueueBatchSQL},
		"relay":                {"100,000 pending rows due now moved to Redis; lag commit→Redis under 2,000 tasks/s for 10 s after 1 s of warm-up (--relay-rate)", relayBench},
		"drain-tx":             {"20,000 tasks due now, 32 slots, no-op transactional handler", drain(drainTx, false)},
		"drain-tx-write":       {"20,000 tasks due now, 32 slots, transactional handler inserting one row", drain(drainTxWrite, false)},
		"drain-tx-group":       {"drain-tx with group commit: 256 slots, up to 64 tasks a transaction", drain(drainTx, true)},
		"drain-tx-write-group": {"drain-tx-write with group commit: 256 slots, up to 64 tasks a transaction", drain(drainTxWrite, true)},
		"drain-plain":          {"20,000 tasks due now, 32 slots, no-op plain handler", drain(drainPlain, false)},
		"lateness":             {"2,000 tasks due 5 s after start, spread over 1 s: handler start − due", lateness(2_000, time.Second)},
		"lateness-steady":      {"25,000 tasks due 5 s after start, spread over 5 s (5,000 starts/s): handler start − due", lateness(25_000, 5*time.Second)},
		"memory":               {"100,000 tasks due in 1 h relayed to Redis: bytes per task in Redis and per outbox row", memory},
		"recovery":             {"a worker process SIGKILLed 1 s into a 60 s task: seconds until the task runs again", recovery},
		"idle":                 {"Redis commands/s of one idle relay and one idle worker", idle},
		"redis-loss":           {"100,000 tasks due over a minute; 10 s in, their keys are deleted (a flush): no operator, every task once, lateness after due or loss", redisLoss(lossFlush)},
		"redis-loss-restart":   {"redis-loss, but a Redis of its own without persistence is killed and restarted, empty", redisLoss(lossRestart)},
		"redis-loss-failover":  {"redis-loss on a Redis Cluster of its own (3 masters, replicas): the queue's master killed while its replica lags 500 ms", redisLoss(lossFailover)},
		"sharded":              {"50,000 tasks due now in one queue on a Redis Cluster of its own (3 masters), relayed and drained by a plain worker (32 slots), in 1 shard, in 3 (--shards), in 3 with 32 slots a shard: each master's share of the commands", sharded},
		"multi-db":             {"20,000 tasks over 1, 2 and 4 PostgreSQL servers of its own feeding a Redis Cluster of its own (3 masters): enqueue-tx (8 producers in all) and drain-tx (32 slots in all), throughput per database and in total, CPU per task against one database (run only by name)", multiDB},
		"soak":                 {"10 minutes at 500 tasks/s, one failure in 20, pruning after 5 s: samples of what could grow, then exactly-once checked (run only by name)", soak},
		"prune":                {"1,000,000 done rows past retention, one retention pass while 8 producers commit 200 tasks/s: its duration, enqueue p99 before, during, after (run only by name)", prune},
		"rate-limit":           {"a queue limited to 200 starts/s and an unlimited one, both backlogged, 4 workers: the observed rate over 60 s, the other queue's drain", rateLimit},
		"priority":             {"three queues weighted 6:3:1 in one priority group, a backlog in each, 2 workers of 16 slots: each queue's share of the first 10,000 starts; then one queue, 10,000 due tasks of priorities 9, 4, 0 mixed: each priority's share of its starts", priority},
		"bounds":               {"pgbench running enqueue-tx's, drain-tx's and drain-tx-write's own transactions, redis-benchmark a 3-command script: the ceilings", bounds},
		"fairness":             {"100 keys, one with a backlog 1000x the others', cap 4 per key, 32 slots: each key's share of the starts, the small keys' lateness while the big key drains, the claim's cost with keys against without, Redis bytes per key (issue 34)", fairness},
		"workflow":             {"10,000 plain tasks against a batch of 10,000 children with a callback (two rounds each, 32 slots, no-op transactional handlers); 200 batches of 10 for the callback's lateness; a chain of 1,000 (issue 33)", workflowBench},
	}
}

var payload20 = []byte(`{"order":"12345678"}`) // 20 bytes, the size the targets are stated for

// enqueueTx: producers committing a task due after delay each, through an outbox
// client with the given NotifyCooldown (0: the default).
func enqueueTx(delay, cooldown time.Duration) func(ctx context.Context, s *session, r *Result) error {
	return func(ctx context.Context, s *session, r *Result) error {
		// A channel of the session's own, so that the count is this run's alone.
		ob, err := outbox.New(outbox.Config{Schema: s.schema, NotifyChannel: s.schema, NotifyCooldown: cooldown})
		if err != nil {
			return err
		}
		r.Params["due_in"], r.Params["notify_cooldown"] = delay.String(), ob.Config().NotifyCooldown.String()
		if cooldown < 0 {
			r.Params["notify_cooldown"] = "-1 (every commit)"
		}
		return withNotifications(ctx, s, r, func() error { return enqueueTxRun(ctx, s, r, ob.Enqueue, delay) })
	}
}

// withNotifications runs run while counting the notifications on the session's
// channel, and adds their count to r.
func withNotifications(ctx context.Context, s *session, r *Result, run func() error) error {
	count, err := s.countNotifications(ctx, s.schema)
	if err != nil {
		return err
	}
	err = run()
	notified, cerr := count()
	if err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	r.add("notifications", float64(notified), "notifications")
	return nil
}

// countNotifications LISTENs on channel on a connection of its own; count sends a
// marker, waits for it and returns how many notifications came before it.
func (s *session) countNotifications(ctx context.Context, channel string) (count func() (int, error), err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		conn.Release()
		return nil, err
	}
	return func() (int, error) {
		c := conn.Hijack() // LISTENing: not for the pool again
		defer c.Close(context.WithoutCancel(ctx))
		if _, err := s.pool.Exec(ctx, `SELECT pg_notify($1, '')`, channel); err != nil {
			return 0, err
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		n := 0
		for {
			m, err := c.WaitForNotification(wctx)
			if err != nil {
				return n, err
			}
			if m.Payload == "" {
				return n, nil
			}
			n++
		}
	}, nil
}

// enqueueFunc is an enqueue in the caller's transaction: outbox.Client's, or the
// SQL API's (sqlapi.Client's).
type enqueueFunc func(ctx context.Context, q outbox.Querier, t outbox.Task) (outbox.Result, error)

func enqueueTxRun(ctx context.Context, s *session, r *Result, enqueue enqueueFunc, delay time.Duration) error {
	n, producers := s.n(20_000), 8
	r.Params["tasks"], r.Params["producers"] = n, producers
	var next atomic.Int64
	before := s.cpu(ctx)
	start := time.Now()
	err := parallel(producers, func() error {
		for {
			i := next.Add(1)
			if i > int64(n) {
				return nil
			}
			tx, err := s.pool.Begin(ctx)
			if err != nil {
				return err
			}
			res, err := enqueue(ctx, tx, outbox.Task{Queue: "bench", ID: fmt.Sprintf("task-%d", i),
				Payload: payload20, Delay: delay})
			if err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			if res.Duplicate {
				_ = tx.Rollback(ctx)
				return fmt.Errorf("task-%d reported duplicate", i)
			}
			if err := tx.Commit(ctx); err != nil {
				return err
			}
		}
	})
	elapsed := time.Since(start)
	if err != nil {
		return err
	}
	r.add("enqueue_tx", float64(n)/elapsed.Seconds(), "tasks/s")
	r.addCPU("enqueue", before, s.cpu(ctx), n)
	return s.checkRows(ctx, r, n)
}

func enqueueBatch(ctx context.Context, s *session, r *Result) error {
	return enqueueBatchRun(ctx, s, r, s.ob.EnqueueMany)
}

func enqueueBatchRun(ctx context.Context, s *session, r *Result,
	enqueueMany func(ctx context.Context, q outbox.Querier, tasks []outbox.Task) (outbox.ManyResult, error),
) error {
	n, batch := s.n(100_000), 10_000
	r.Params["tasks"], r.Params["batch"] = n, batch
	tasks := make([]outbox.Task, 0, batch)
	start := time.Now()
	for i := 0; i < n; i += batch {
		tasks = tasks[:0]
		for j := i; j < min(i+batch, n); j++ {
			tasks = append(tasks, outbox.Task{Queue: "bench", ID: fmt.Sprintf("task-%d", j), Payload: payload20, Delay: time.Hour})
		}
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := enqueueMany(ctx, tx, tasks); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	r.add("enqueue_batch", float64(n)/time.Since(start).Seconds(), "tasks/s")
	return s.checkRows(ctx, r, n)
}

// checkRows checks that the outbox holds exactly n rows.
func (s *session) checkRows(ctx context.Context, r *Result, n int) error {
	var rows int64
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()).Scan(&rows); err != nil {
		return err
	}
	r.Checks = map[string]int64{"rows": rows}
	if rows != int64(n) {
		return fmt.Errorf("outbox holds %d rows, want %d", rows, n)
	}
	return nil
}

// parallel runs f in n goroutines and returns the first error.
func parallel(n int, f func() error) error {
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for range n {
		wg.Go(func() {
			if err := f(); err != nil {
				once.Do(func() { first = err })
			}
		})
	}
	wg.Wait()
	return first
}
