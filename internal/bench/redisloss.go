package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq/worker"
	"github.com/delayq/delayq/outbox"
)

// redisLoss: 100,000 tasks due over the next minute, a relay and a worker running;
// 10 s in, everything Redis holds under the workload's prefix is deleted (what a
// FLUSHALL or a restart without persistence does to it; the workload deletes only
// its own keys, so a shared server keeps the rest). Nobody runs reconcile: the
// relay detects the loss by its epoch mark and repairs from Postgres. Every task
// must run once (a transactional handler writes one effect row each), none early,
// and the figure is how late each started after its due time or the loss,
// whichever is later; the target is 10 s for the last one.
func redisLoss(ctx context.Context, s *session, r *Result) error {
	n := s.n(100_000)
	const (
		lead   = 5 * time.Second  // before the first task is due: the relay moves them
		spread = time.Minute      // due times spread over this
		lossAt = 10 * time.Second // after the start
	)
	r.Params["tasks"], r.Params["spread"], r.Params["loss_after"] = n, spread.String(), lossAt.String()
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
	startedRelay, err := s.startRelay(ctx)
	if err != nil {
		return err
	}
	stopRelay := sync.OnceValue(startedRelay)
	defer stopRelay() //nolint:errcheck // stopped below; this one for early returns

	w, err := worker.New(s.pool, s.dq, s.ob, worker.Config{})
	if err != nil {
		return err
	}
	err = w.HandleTx("bench", func(ctx context.Context, tx pgx.Tx, t *worker.Task) error {
		_, err := tx.Exec(ctx, `INSERT INTO bench_effects VALUES ($1, $2, $3)`, t.ID, t.Due, t.ClaimedAt)
		return err
	}, worker.QueueConfig{Concurrency: 32})
	if err != nil {
		return err
	}
	stopWorker := sync.OnceValue(s.background(ctx, w.Run))
	defer stopWorker() //nolint:errcheck // stopped below; this one for early returns

	if !sleepCtx(ctx, time.Until(start.Add(lossAt))) {
		return ctx.Err()
	}
	queued, err := s.countState(ctx, "queued")
	if err != nil {
		return err
	}
	lost := time.Now()
	s.deleteKeys(ctx)
	r.Params["queued_at_loss"] = queued

	if err := waitFor(ctx, lead+spread+2*time.Minute, "every task to finish", func() (bool, error) {
		done, err := s.countState(ctx, "done")
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
