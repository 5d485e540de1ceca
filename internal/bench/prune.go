package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// prune measures one retention pass over a large backlog of finished rows, and
// what it does to producers meanwhile: the outbox holds 1,000,000 done rows past
// their retention (as after a retention shortened, or a relay down for a while),
// 8 producers commit tasks due in an hour at a steady 200 tasks/s (Soak.Rate when
// set), each in its own transaction; after 5 s a relay starts, whose first
// retention pass deletes the backlog in batches of relay.Config{}.WithDefaults().RetentionBatch
// (Soak.RetentionBatch when set); the producers go on 5 s after it ends. Figures:
// the pass's duration and rows/s, and the enqueue p99 and max before, during and
// after it.
func prune(ctx context.Context, s *session, r *Result) error {
	rows := s.n(1_000_000)
	rate := cmp.Or(s.env.Soak.Rate, 200)
	batch := cmp.Or(s.env.Soak.RetentionBatch, relay.Config{}.WithDefaults().RetentionBatch)
	quiet := s.timed(5 * time.Second)
	r.Params["rows"], r.Params["rate"], r.Params["retention_batch"] = rows, rate, batch

	// The backlog, as the worker leaves rows: done, payload cleared, finished a day
	// ago (past any retention below it); then vacuumed, so that the pass starts
	// from a table in steady state.
	if _, err := s.pool.Exec(ctx, `INSERT INTO `+taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()+` (queue, task_id, run_at, created_at, payload,
		max_attempts, attempt, state, queued_at, done_at)
		SELECT 'old', 'old-' || g, now() - interval '1 day', now() - interval '1 day', '', 25, 1, 'done',
		       now() - interval '1 day', now() - interval '1 day' + g * interval '1 microsecond'
		FROM generate_series(1, $1::int) AS g`, rows); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, `VACUUM ANALYZE `+taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()); err != nil {
		return err
	}
	_, _ = s.pool.Exec(ctx, "CHECKPOINT")
	var before int64
	if err := s.pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)`, taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()).Scan(&before); err != nil {
		return err
	}

	stats := &soakStats{batch: int64(batch)}
	relayPool, err := s.tracedPool(ctx, 4, relayTracer{stats})
	if err != nil {
		return err
	}
	defer relayPool.Close()
	rl, err := relay.New(relayPool, s.dq.AsRedis(), relay.Config{Schema: s.schema, Retention: time.Hour,
		RetentionInterval: 24 * time.Hour, RetentionBatch: batch, Observer: relayTracer{stats}})
	if err != nil {
		return err
	}

	// Each enqueue goes to the phase it overlapped: before the pass (the clock at
	// 0), during it, after it (an even clock past 0).
	var (
		mu                 sync.Mutex
		phase              [3]histogram // before, during, after
		passStart, passEnd time.Time
		stop               atomic.Bool
		enqueued           atomic.Int64
		step               = time.Second / time.Duration(rate)
		producers          = 8
		begin              = time.Now()
	)
	record := func(g0 int64, d time.Duration) {
		g1 := stats.clock.now()
		i := 2
		switch {
		case overlapped(g0, g1):
			i = 1
		case g0 == 0:
			i = 0
		}
		mu.Lock()
		phase[i].add(d)
		mu.Unlock()
	}
	producing := s.background(ctx, func(ctx context.Context) error {
		return parallel(producers, func() error {
			for !stop.Load() && ctx.Err() == nil {
				i := enqueued.Add(1) - 1
				if d := time.Until(begin.Add(time.Duration(i) * step)); d > 0 {
					time.Sleep(d)
				}
				g0, t0 := stats.clock.now(), time.Now()
				err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
					_, err := s.ob.Enqueue(ctx, tx, outbox.Task{Queue: "new", ID: fmt.Sprintf("new-%d", i),
						Payload: payload20, Delay: time.Hour})
					return err
				})
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
				record(g0, time.Since(t0))
			}
			return nil
		})
	})
	if !sleepCtx(ctx, quiet) {
		err = ctx.Err()
	}
	var stopRelay func() error
	if err == nil {
		passStart = time.Now()
		stopRelay = s.background(ctx, rl.Run)
		err = waitFor(ctx, 30*time.Minute, "the retention pass", func() (bool, error) {
			return stats.clock.now() >= 2, nil
		})
		passEnd = time.Now()
	}
	if err == nil && !sleepCtx(ctx, quiet) {
		err = ctx.Err()
	}
	stop.Store(true)
	err = errors.Join(err, producing())
	if stopRelay != nil {
		err = errors.Join(err, stopRelay())
	}
	if err != nil {
		return err
	}
	var left, after int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()+` WHERE queue = 'old'`).Scan(&left); err != nil {
		return err
	}
	if err := s.pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass)`, taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()).Scan(&after); err != nil {
		return err
	}
	all := stats.swap()
	r.Checks = map[string]int64{"rows": int64(rows), "pruned": all.pruneRows, "left": left,
		"enqueued_before": phase[0].n, "enqueued_during": phase[1].n, "enqueued_after": phase[2].n}
	if left != 0 || all.pruneRows != int64(rows) || phase[0].n == 0 || phase[1].n == 0 || phase[2].n == 0 {
		return fmt.Errorf("checks %v: want every old row pruned, enqueues in each phase", r.Checks)
	}
	took := all.prunePasses.quantile(100)
	r.add("prune_pass", took.Seconds(), "s")
	r.add("prune_pass_wall", passEnd.Sub(passStart).Seconds(), "s") // from the relay's start
	r.add("prune_rate", float64(rows)/took.Seconds(), "rows/s")
	r.add("prune_batch_p99", ms(all.pruneBatches.quantile(99)), "ms")
	r.add("prune_batch_max", ms(all.pruneBatches.quantile(100)), "ms")
	for i, name := range []string{"before", "during", "after"} {
		r.add("enqueue_p50_"+name, ms(phase[i].quantile(50)), "ms")
		r.add("enqueue_p99_"+name, ms(phase[i].quantile(99)), "ms")
		r.add("enqueue_max_"+name, ms(phase[i].quantile(100)), "ms")
		r.add("enqueue_rate_"+name, float64(phase[i].n)/map[int]time.Duration{
			0: passStart.Sub(begin), 1: passEnd.Sub(passStart), 2: time.Since(passEnd)}[i].Seconds(), "tasks/s")
	}
	r.add("outbox_bytes_before", float64(before), "B")
	r.add("outbox_bytes_after", float64(after), "B")
	return nil
}
