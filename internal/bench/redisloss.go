package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/tempserver"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// The redis-loss workloads: 100,000 tasks due over the next minute, a relay and a
// worker running; 10 s in, Redis loses what it holds of them, and nobody runs
// reconcile: the relay detects the loss (its epoch mark gone, or the master's
// identity changed) and repairs from Postgres. Every task must run once (a
// transactional handler writes one effect row each), none early, and the figure
// is how late each started after its due time or the loss, whichever is later;
// the target is 10 s for the last one. How Redis loses them:
//
//   - flush (redis-loss): every key of the workload's prefix is deleted, what a
//     FLUSHALL does to it (only its own keys, so a shared server keeps the rest);
//   - restart (redis-loss-restart): a Redis server of the workload's own, without
//     persistence, is killed (SIGKILL) and started again, empty;
//   - failover (redis-loss-failover): a Redis Cluster of its own, 3 masters with a
//     replica each; the master serving the queue is killed while its replica lags
//     500 ms behind (frozen, its link cut), and the cluster promotes the replica,
//     which lacks what the master acknowledged in that lag.
type lossKind string

const (
	lossFlush    lossKind = "flush"
	lossRestart  lossKind = "restart"
	lossFailover lossKind = "failover"
)

// failoverLag is how far the replica is behind when its master dies: well below
// the cluster node timeout (2 s), or the frozen replica is taken for failed too.
const failoverLag = 500 * time.Millisecond

// lossTarget is the Redis a redis-loss workload runs on, and how it loses data.
type lossTarget struct {
	dq *dispatch.Client
	// lose makes Redis lose the workload's tasks and returns when the loss
	// began: the flush, the kill, the start of the replica's lag.
	lose  func(ctx context.Context, r *Result) (time.Time, error)
	close func()
}

// lossTarget sets up the Redis of kind.
func (s *session) lossTarget(ctx context.Context, kind lossKind) (*lossTarget, error) {
	switch kind {
	case lossFlush:
		return &lossTarget{dq: s.dq, close: func() {}, lose: func(ctx context.Context, _ *Result) (time.Time, error) {
			lost := time.Now()
			s.deleteKeys(ctx)
			return lost, nil
		}}, nil
	case lossRestart:
		own, err := tempserver.StartRedis(ctx, tempserver.RedisOptions{})
		if err != nil {
			return nil, err
		}
		opt, err := redis.ParseURL(own.URL())
		if err != nil {
			own.Close()
			return nil, err
		}
		opt.PoolSize = 64
		rdb := redis.NewClient(opt)
		dq, err := dispatch.New(rdb, dispatch.Config{Prefix: s.prefix})
		if err != nil {
			_ = rdb.Close()
			own.Close()
			return nil, err
		}
		return &lossTarget{dq: dq, close: func() { _ = rdb.Close(); own.Close() },
			lose: func(ctx context.Context, r *Result) (time.Time, error) {
				lost := time.Now()
				own.Kill()
				if err := own.Start(ctx); err != nil {
					return lost, fmt.Errorf("start Redis again: %w", err)
				}
				r.add("redis_down", time.Since(lost).Seconds(), "s")
				return lost, nil
			}}, nil
	case lossFailover:
		cl, err := tempserver.StartRedisCluster(ctx, 3)
		if err != nil {
			return nil, err
		}
		if err := cl.WaitReplicas(ctx); err != nil {
			cl.Close()
			return nil, err
		}
		// A short slot reload: after a master dies nothing answers MOVED for its
		// slots, so the client learns the promoted replica from the reload.
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), PoolSize: 64,
			ClusterStateReloadInterval: time.Second, DialTimeout: time.Second,
			ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second})
		dq, err := dispatch.New(rdb, dispatch.Config{Prefix: s.prefix})
		if err != nil {
			_ = rdb.Close()
			cl.Close()
			return nil, err
		}
		return &lossTarget{dq: dq, close: func() { _ = rdb.Close(); cl.Close() },
			lose: func(ctx context.Context, r *Result) (time.Time, error) {
				k, err := dq.Keys("bench")
				if err != nil {
					return time.Time{}, err
				}
				m, err := cl.MasterFor(ctx, k.Ready)
				if err != nil {
					return time.Time{}, err
				}
				lost := time.Now()
				if _, err := cl.KillMaster(ctx, m, failoverLag); err != nil {
					return lost, err
				}
				r.add("failover", time.Since(lost).Seconds(), "s")
				return lost, nil
			}}, nil
	}
	return nil, fmt.Errorf("bench: loss kind %q", kind)
}

// redisLoss returns the workload of kind.
func redisLoss(kind lossKind) func(ctx context.Context, s *session, r *Result) error {
	return func(ctx context.Context, s *session, r *Result) error { return runRedisLoss(ctx, s, r, kind) }
}

func runRedisLoss(ctx context.Context, s *session, r *Result, kind lossKind) error {
	n := s.n(100_000)
	var (
		lead   = s.timed(5 * time.Second)  // before the first task is due: the relay moves them
		spread = s.timed(time.Minute)      // due times spread over this
		lossAt = s.timed(10 * time.Second) // after the start
	)
	r.Params["tasks"], r.Params["spread"], r.Params["loss_after"], r.Params["loss"] = n, spread.String(), lossAt.String(), string(kind)
	tgt, err := s.lossTarget(ctx, kind)
	if err != nil {
		return err
	}
	defer tgt.close()
	if _, err := s.pool.Exec(ctx, `CREATE TABLE bench_effects (task_id text NOT NULL, due timestamptz NOT NULL, started timestamptz NOT NULL)`); err != nil {
		return err
	}
	start := time.Now()
	tasks := make([]outbox.Task, 0, 10_000)
	for i := 0; i < n; i += 10_000 {
		tasks = tasks[:0]
		for j := i; j < min(i+10_000, n); j++ {
			due := start.Add(lead + time.Duration(int64(spread)*int64(j)/int64(n)))
			tasks = append(tasks, outbox.Task{Queue: "bench", ID: fmt.Sprintf("task-%06d", j), Payload: payload20, RunAt: due})
		}
		if _, err := s.ob.EnqueueMany(ctx, s.pool, tasks); err != nil {
			return err
		}
	}
	rl, err := relay.New(s.pool, tgt.dq.AsRedis(), relay.Config{Schema: s.schema})
	if err != nil {
		return err
	}
	stopRelay := sync.OnceValue(s.background(ctx, rl.Run))
	defer stopRelay() //nolint:errcheck // stopped below; this one for early returns

	w, err := clientkit.NewClient(s.pool, tgt.dq, s.ob, delayq.WorkerConfig{})
	if err != nil {
		return err
	}
	err = w.HandleTx("bench", func(ctx context.Context, tx pgx.Tx, t *delayq.Task) error {
		_, err := tx.Exec(ctx, `INSERT INTO bench_effects VALUES ($1, $2, $3)`, t.ID, t.Due, t.ClaimedAt)
		return err
	}, delayq.QueueConfig{Concurrency: 32})
	if err != nil {
		return err
	}
	stopWorker := sync.OnceValue(s.background(ctx, w.Run))
	defer stopWorker() //nolint:errcheck // stopped below; this one for early returns

	if !sleepCtx(ctx, time.Until(start.Add(lossAt))) {
		return ctx.Err()
	}
	queued, err := s.countState(ctx, delayqtype.StateQueued)
	if err != nil {
		return err
	}
	lost, err := tgt.lose(ctx, r)
	if err != nil {
		return err
	}
	r.Params["queued_at_loss"] = queued

	if err := waitFor(ctx, lead+spread+2*time.Minute, "every task to finish", func() (bool, error) {
		done, err := s.countState(ctx, delayqtype.StateDone)
		return done == n, err
	}); err != nil {
		return err
	}
	if err := stopWorker(); err != nil {
		return err
	}
	if err := stopRelay(); err != nil {
		return err
	}

	rows, err := s.pool.Query(ctx, `SELECT task_id, due, started FROM bench_effects`)
	if err != nil {
		return err
	}
	var (
		runs    = map[string]int{}
		early   int64
		late    []time.Duration
		lastDue time.Time
		lastLag time.Duration
	)
	var id string
	var due, started time.Time
	_, err = pgx.ForEachRow(rows, []any{&id, &due, &started}, func() error {
		runs[id]++
		if started.Before(due) {
			early++
		}
		from := due
		if from.Before(lost) {
			from = lost
		}
		lag := max(started.Sub(from), 0)
		late = append(late, lag)
		if due.After(lastDue) {
			lastDue, lastLag = due, lag
		}
		return nil
	})
	if err != nil {
		return err
	}
	var twice int64
	for _, c := range runs {
		if c > 1 {
			twice++
		}
	}
	slices.Sort(late)
	pct := func(p float64) float64 {
		if len(late) == 0 {
			return 0
		}
		return late[min(len(late)-1, int(p*float64(len(late))))].Seconds()
	}
	r.add("late_p50", pct(0.50), "s")
	r.add("late_p99", pct(0.99), "s")
	r.add("late_max", pct(1), "s")
	r.add("last_due_late", lastLag.Seconds(), "s")
	r.Checks = map[string]int64{"tasks": int64(n), "ran": int64(len(runs)), "effects_twice": twice, "early": early}
	if len(runs) != n || twice != 0 || early != 0 {
		return fmt.Errorf("%d of %d tasks ran, %d twice, %d early", len(runs), n, twice, early)
	}
	return nil
}

// sleepCtx waits d, or until ctx ends (false). The workload's own timeline only.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
