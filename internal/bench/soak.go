package bench

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq/worker"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// soakSample is the state of the servers and of this process at one moment of a
// soak.
type soakSample struct {
	at          time.Duration // since the load started
	done        int64         // tasks whose effect committed
	redisBytes  int64         // used_memory
	outboxBytes int64         // pg_total_relation_size of the outbox
	deadTuples  int64         // the outbox's n_dead_tup
	heapBytes   uint64        // this process's live Go heap
	goroutines  int
}

// soak runs the whole path under a steady load for a while, to show what a short
// workload cannot: whether anything grows with time. Producers commit tasks at a
// steady rate, each in its own transaction, due 0.1–2.1 s later (later than the
// relay's lag, so that lateness measures the worker); a relay prunes finished rows
// after 5 s; a worker with 32 slots runs a transactional handler that inserts an
// effect row and fails the first attempt of one task in 20 (retried after 50–100
// ms, the backoff's first step with its jitter). Every interval a sample (Redis used_memory, the outbox's size
// and dead tuples, the Go heap, goroutines) goes to the log. At the end the
// backlog drains and every task must have exactly one effect row, none started
// early and none be left unfinished. Full size: 10 minutes at 500 tasks/s.
func soak(ctx context.Context, s *session, r *Result) error {
	duration := max(3*time.Second, time.Duration(float64(10*time.Minute)*s.env.Scale))
	rate := max(20, int(500*s.env.Scale))
	interval := max(time.Second, duration/20)
	r.Params["duration"], r.Params["rate"], r.Params["sample_every"] = duration.String(), rate, interval.String()

	if _, err := s.pool.Exec(ctx, `CREATE TABLE soak_effects (task_id text NOT NULL, attempt int NOT NULL)`); err != nil {
		return err
	}
	rl, err := relay.New(s.pool, s.dq, relay.Config{Schema: s.schema, Retention: 5 * time.Second, RetentionInterval: time.Second})
	if err != nil {
		return err
	}
	w, err := worker.New(s.pool, s.dq, s.ob, worker.Config{})
	if err != nil {
		return err
	}
	var (
		st      starts // every run
		failed  atomic.Int64
		enqueue atomic.Int64
	)
	done := func() int64 { return w.Stats().Succeeded } // completions committed
	err = w.HandleTx("soak", func(ctx context.Context, tx pgx.Tx, t *worker.Task) error {
		st.record(t)
		if t.Attempt == 1 && failsOnce(t.ID) {
			failed.Add(1)
			return errors.New("soak: injected failure")
		}
		_, err := tx.Exec(ctx, `INSERT INTO soak_effects (task_id, attempt) VALUES ($1, $2)`, t.ID, t.Attempt)
		return err
	}, worker.QueueConfig{Concurrency: 32, Backoff: worker.Backoff{Base: 100 * time.Millisecond, Max: time.Second}})
	if err != nil {
		return err
	}
	stopRelay := s.background(ctx, rl.Run)
	stopWorker := s.background(ctx, w.Run)
	stopAll := func() error { return errors.Join(stopWorker(), stopRelay()) }

	begin := time.Now()
	sample := func() (soakSample, error) {
		smp := soakSample{at: time.Since(begin), done: done(), goroutines: runtime.NumGoroutine()}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		smp.heapBytes = ms.HeapAlloc
		var err error
		if smp.redisBytes, err = s.usedMemory(ctx); err != nil {
			return smp, err
		}
		err = s.pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass),
			COALESCE((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass), 0)`,
			s.ob.Table()).Scan(&smp.outboxBytes, &smp.deadTuples)
		return smp, err
	}
	var samples []soakSample
	sampling := s.background(ctx, func(ctx context.Context) error {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
			smp, err := sample()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			samples = append(samples, smp)
			s.env.Logger.Info("soak", "at", smp.at.Round(time.Second), "enqueued", enqueue.Load(), "done", smp.done,
				"redis_bytes", smp.redisBytes, "outbox_bytes", smp.outboxBytes, "outbox_dead_tuples", smp.deadTuples,
				"go_heap_bytes", smp.heapBytes, "goroutines", smp.goroutines)
		}
	})

	// Producers: task i commits no earlier than begin + i/rate.
	total := int64(duration.Seconds() * float64(rate))
	step := time.Second / time.Duration(rate)
	err = parallel(8, func() error {
		for {
			i := enqueue.Add(1) - 1
			if i >= total {
				enqueue.Add(-1)
				return nil
			}
			if d := time.Until(begin.Add(time.Duration(i) * step)); d > 0 {
				time.Sleep(d)
			}
			err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
				_, err := s.ob.Enqueue(ctx, tx, outbox.Task{Queue: "soak", ID: fmt.Sprintf("soak-%d", i),
					Payload: payload20, Delay: time.Duration(100+i%2000) * time.Millisecond})
				return err
			})
			if err != nil {
				return err
			}
		}
	})
	steady := time.Since(begin)
	if err == nil {
		err = waitFor(ctx, 5*time.Minute, "the soak's backlog", func() (bool, error) { return done() >= total, nil })
	}
	err = errors.Join(err, sampling(), stopAll())
	if err != nil {
		return err
	}

	var effects, distinct, unfinished int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT task_id) FROM soak_effects`).Scan(&effects, &distinct); err != nil {
		return err
	}
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+s.ob.Table()+` WHERE state NOT IN ('done', 'cancelled')`).Scan(&unfinished); err != nil {
		return err
	}
	lates, early := st.sorted()
	r.Checks = map[string]int64{"tasks": total, "effects": effects, "distinct_effects": distinct,
		"unfinished_rows": unfinished, "injected_failures": failed.Load(), "early": early}
	if effects != total || distinct != total || unfinished != 0 || early != 0 {
		return fmt.Errorf("checks %v: want one effect row per task, no unfinished row, no early start", r.Checks)
	}
	if len(samples) < 2 {
		return fmt.Errorf("%d samples: the load ran %v, shorter than two sample intervals", len(samples), steady)
	}
	first, last := samples[0], samples[len(samples)-1]
	r.add("soak_rate", float64(total)/steady.Seconds(), "tasks/s")
	r.add("lateness_p99", ms(percentileD(lates, 99)), "ms")
	r.add("lateness_max", ms(percentileD(lates, 100)), "ms")
	r.add("redis_bytes_first", float64(first.redisBytes), "B")
	r.add("redis_bytes_last", float64(last.redisBytes), "B")
	r.add("outbox_bytes_first", float64(first.outboxBytes), "B")
	r.add("outbox_bytes_last", float64(last.outboxBytes), "B")
	r.add("outbox_bytes_max", float64(slices.MaxFunc(samples, func(a, b soakSample) int {
		return int(a.outboxBytes - b.outboxBytes)
	}).outboxBytes), "B")
	r.add("go_heap_bytes_first", float64(first.heapBytes), "B")
	r.add("go_heap_bytes_last", float64(last.heapBytes), "B")
	r.add("goroutines_first", float64(first.goroutines), "")
	r.add("goroutines_last", float64(last.goroutines), "")
	return nil
}

// failsOnce tells the tasks whose first attempt the soak's handler fails: one in 20.
func failsOnce(id string) bool {
	h := fnv.New32a()
	h.Write([]byte(id))
	return h.Sum32()%20 == 0
}
