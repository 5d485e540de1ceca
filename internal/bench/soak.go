package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// Soak shapes the soak workload. Zero fields take the defaults: 10 minutes at
// 500 tasks/s (both times Env.Scale), a sample every twentieth of the run, finished
// rows pruned after 5 s every second in batches of relay.Config{}.WithDefaults().RetentionBatch.
type Soak struct {
	Rate              int           // tasks committed a second
	Duration          time.Duration // of the steady load
	SampleEvery       time.Duration
	Retention         time.Duration // relay.Config.Retention
	RetentionInterval time.Duration // relay.Config.RetentionInterval
	RetentionBatch    int           // relay.Config.RetentionBatch
	// GroupCommit, when above 0, commits up to that many runs a transaction
	// (worker.GroupCommit.MaxTasks, with 256 slots as drain-tx-write-group);
	// 0 commits each run alone with 32 slots.
	GroupCommit int
	// Samples, when set, receives each sample as a JSON line.
	Samples io.Writer
}

// soakSample is the state of the servers and of this process at one moment of a
// soak, and what happened since the sample before. Latencies are in ms; the
// _pruning ones are of operations that overlapped a retention pass.
type soakSample struct {
	At          float64 `json:"at_s"` // since the load started
	Enqueued    int64   `json:"enqueued"`
	Done        int64   `json:"done"` // tasks whose effect committed
	EnqueueRate float64 `json:"enqueue_rate"`
	DoneRate    float64 `json:"done_rate"`

	OutboxBytes     int64            `json:"outbox_bytes"`      // pg_total_relation_size
	OutboxHeapBytes int64            `json:"outbox_heap_bytes"` // pg_relation_size
	IndexBytes      map[string]int64 `json:"index_bytes"`
	LiveTuples      int64            `json:"live_tuples"`
	DeadTuples      int64            `json:"dead_tuples"`
	Autovacuums     int64            `json:"autovacuum_count"`
	LastAutovacuum  *time.Time       `json:"last_autovacuum"`
	RedisBytes      int64            `json:"redis_bytes"` // used_memory
	HeapBytes       uint64           `json:"go_heap_bytes"`
	Goroutines      int              `json:"goroutines"`

	EnqueueP99        float64 `json:"enqueue_p99_ms"`
	EnqueueP99Pruning float64 `json:"enqueue_p99_pruning_ms"`
	EnqueuesPruning   int64   `json:"enqueues_pruning"`
	GuardP99          float64 `json:"guard_p99_ms"`
	GuardP99Pruning   float64 `json:"guard_p99_pruning_ms"`
	GuardsPruning     int64   `json:"guards_pruning"`
	LatenessP99       float64 `json:"lateness_p99_ms"`
	LatenessMax       float64 `json:"lateness_max_ms"`
	Early             int64   `json:"early"`
	PrunePasses       int64   `json:"prune_passes"`
	PruneRows         int64   `json:"prune_rows"`
	PrunePassMax      float64 `json:"prune_pass_max_ms"`
	PruneBatchP99     float64 `json:"prune_batch_p99_ms"`
	PruneBatchMax     float64 `json:"prune_batch_max_ms"`
}

// soak runs the whole path under a steady load for a while, to show what a short
// workload cannot: whether anything grows with time. Producers commit tasks at a
// steady rate, each in its own transaction, due 0.1–2.1 s later (later than the
// relay's lag, so that lateness measures the worker); a relay prunes finished rows
// (after 5 s, every second, by default); a worker with 32 slots runs a
// transactional handler that inserts an effect row and fails the first attempt of
// one task in 20 (retried after 50–100 ms, the backoff's first step with its
// jitter). Every interval a sample goes to the log and to Soak.Samples: the
// outbox's table and index sizes, tuples and autovacuum runs, Redis used_memory,
// the Go heap, goroutines, and the interval's p99 of enqueue and of the worker's
// completion (guard and COMMIT), apart while a retention pass ran, lateness, and
// the passes' durations and rows. At the end the backlog drains and every task
// must have exactly one effect row, none started early and none be left
// unfinished. Full size: 10 minutes at 500 tasks/s.
func soak(ctx context.Context, s *session, r *Result) error {
	cfg := s.env.Soak
	duration := cmp.Or(cfg.Duration, max(3*time.Second, time.Duration(float64(10*time.Minute)*s.env.Scale)))
	rate := cmp.Or(cfg.Rate, max(20, int(500*s.env.Scale)))
	interval := cmp.Or(cfg.SampleEvery, max(time.Second, duration/20))
	retention := cmp.Or(cfg.Retention, 5*time.Second)
	retentionEvery := cmp.Or(cfg.RetentionInterval, time.Second)
	batch := cmp.Or(cfg.RetentionBatch, relay.Config{}.WithDefaults().RetentionBatch)
	producers := max(8, rate/125)
	r.Params["duration"], r.Params["rate"], r.Params["sample_every"] = duration.String(), rate, interval.String()
	r.Params["retention"], r.Params["retention_interval"], r.Params["retention_batch"] = retention.String(), retentionEvery.String(), batch
	r.Params["producers"], r.Params["group_commit"] = producers, cfg.GroupCommit

	if _, err := s.pool.Exec(ctx, `CREATE TABLE soak_effects (task_id text NOT NULL, attempt int NOT NULL)`); err != nil {
		return err
	}
	stats := &soakStats{batch: int64(batch)}
	// The relay and the worker get pools of their own, traced: the retention's
	// statements and the worker's completions are timed where they are sent.
	relayPool, err := s.tracedPool(ctx, 8, relayTracer{stats})
	if err != nil {
		return err
	}
	defer relayPool.Close()
	workerPool, err := s.tracedPool(ctx, 40, workerTracer{stats})
	if err != nil {
		return err
	}
	defer workerPool.Close()
	rl, err := relay.New(relayPool, s.dq.AsRedis(), relay.Config{Schema: s.schema, Retention: retention,
		RetentionInterval: retentionEvery, RetentionBatch: batch, Observer: relayTracer{stats}})
	if err != nil {
		return err
	}
	w, err := clientkit.NewClient(workerPool, s.dq, s.ob, delayq.WorkerConfig{})
	if err != nil {
		return err
	}
	var (
		failed  atomic.Int64
		enqueue atomic.Int64
	)
	done := func() int64 { return w.RunStats().Succeeded } // completions committed
	err = w.HandleTx("soak", func(ctx context.Context, tx pgx.Tx, t *delayq.Task) error {
		stats.started(t)
		if t.Attempt == 1 && failsOnce(t.ID) {
			failed.Add(1)
			return errors.New("soak: injected failure")
		}
		_, err := tx.Exec(ctx, `INSERT INTO soak_effects (task_id, attempt) VALUES ($1, $2)`, t.ID, t.Attempt)
		return err
	}, soakQueueConfig(cfg.GroupCommit))
	if err != nil {
		return err
	}
	stopRelay := s.background(ctx, rl.Run)
	stopWorker := s.background(ctx, w.Run)
	stopAll := func() error { return errors.Join(stopWorker(), stopRelay()) }

	begin := time.Now()
	var prev soakSample
	sample := func() (soakSample, error) {
		win := stats.swap()
		smp := soakSample{At: time.Since(begin).Seconds(), Enqueued: enqueue.Load(), Done: done(),
			Goroutines: runtime.NumGoroutine(),
			EnqueueP99: ms(win.enqueue.quantile(99)), EnqueueP99Pruning: ms(win.enqueuePruning.quantile(99)),
			EnqueuesPruning: win.enqueuePruning.n,
			GuardP99:        ms(win.completion.quantile(99)), GuardP99Pruning: ms(win.completionPruning.quantile(99)),
			GuardsPruning: win.completionPruning.n,
			LatenessP99:   ms(win.lateness.quantile(99)), LatenessMax: ms(win.lateness.quantile(100)), Early: win.early,
			PrunePasses: win.prunePasses.n, PruneRows: win.pruneRows, PrunePassMax: ms(win.prunePasses.quantile(100)),
			PruneBatchP99: ms(win.pruneBatches.quantile(99)), PruneBatchMax: ms(win.pruneBatches.quantile(100))}
		if dt := smp.At - prev.At; dt > 0 {
			smp.EnqueueRate = float64(win.enqueued) / dt
			smp.DoneRate = float64(smp.Done-prev.Done) / dt
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		smp.HeapBytes = ms.HeapAlloc
		var err error
		if smp.RedisBytes, err = s.usedMemory(ctx); err != nil {
			return smp, err
		}
		if err := s.outboxSizes(ctx, &smp); err != nil {
			return smp, err
		}
		prev = smp
		return smp, nil
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
			s.env.Logger.Info("soak", "at", time.Duration(smp.At*float64(time.Second)).Round(time.Second),
				"enqueued", smp.Enqueued, "done", smp.Done, "enqueue_rate", int(smp.EnqueueRate),
				"outbox_bytes", smp.OutboxBytes, "dead_tuples", smp.DeadTuples, "autovacuums", smp.Autovacuums,
				"enqueue_p99_ms", smp.EnqueueP99, "enqueue_p99_pruning_ms", smp.EnqueueP99Pruning,
				"guard_p99_ms", smp.GuardP99, "guard_p99_pruning_ms", smp.GuardP99Pruning,
				"prune_rows", smp.PruneRows, "prune_pass_max_ms", smp.PrunePassMax, "redis_bytes", smp.RedisBytes)
			if cfg.Samples != nil {
				b, err := json.Marshal(smp)
				if err != nil {
					return err
				}
				if _, err := cfg.Samples.Write(append(b, '\n')); err != nil {
					return err
				}
			}
		}
	})

	// Producers: task i commits no earlier than begin + i/rate, none after the
	// duration: a machine that cannot hold the rate commits fewer tasks, and the
	// samples' enqueue_rate says how many.
	step := time.Second / time.Duration(rate)
	err = parallel(producers, func() error {
		for {
			i := enqueue.Add(1) - 1
			if i >= int64(duration.Seconds()*float64(rate)) || time.Since(begin) >= duration {
				enqueue.Add(-1)
				return nil
			}
			if d := time.Until(begin.Add(time.Duration(i) * step)); d > 0 {
				time.Sleep(d)
			}
			g0, t0 := stats.clock.now(), time.Now()
			err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
				_, err := s.ob.Enqueue(ctx, tx, outbox.Task{Queue: "soak", ID: fmt.Sprintf("soak-%d", i),
					Payload: payload20, Delay: time.Duration(100+i%2000) * time.Millisecond})
				return err
			})
			if err != nil {
				return err
			}
			stats.enqueued(g0, time.Since(t0))
		}
	})
	steady := time.Since(begin)
	total := enqueue.Load()
	if err == nil {
		err = waitFor(ctx, 10*time.Minute, "the soak's backlog", func() (bool, error) { return done() >= total, nil })
	}
	err = errors.Join(err, sampling(), stopAll())
	if err != nil {
		return err
	}

	var effects, distinct, unfinished int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT task_id) FROM soak_effects`).Scan(&effects, &distinct); err != nil {
		return err
	}
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()+` WHERE state NOT IN ('done', 'cancelled')`).Scan(&unfinished); err != nil {
		return err
	}
	stats.swap() // the last window, into all
	all := stats.all
	r.Checks = map[string]int64{"tasks": total, "effects": effects, "distinct_effects": distinct,
		"unfinished_rows": unfinished, "injected_failures": failed.Load(), "early": all.early}
	if effects != total || distinct != total || unfinished != 0 || all.early != 0 {
		return fmt.Errorf("checks %v: want one effect row per task, no unfinished row, no early start", r.Checks)
	}
	if len(samples) < 2 {
		return fmt.Errorf("%d samples: the load ran %v, shorter than two sample intervals", len(samples), steady)
	}
	first, last := samples[0], samples[len(samples)-1]
	most := func(f func(soakSample) int64) float64 {
		return float64(f(slices.MaxFunc(samples, func(a, b soakSample) int { return cmp.Compare(f(a), f(b)) })))
	}
	r.add("soak_rate", float64(total)/steady.Seconds(), "tasks/s") // below rate: the machine could not hold it
	r.add("lateness_p99", ms(all.lateness.quantile(99)), "ms")
	r.add("lateness_max", ms(all.lateness.quantile(100)), "ms")
	r.add("enqueue_p99", ms(all.enqueue.quantile(99)), "ms")
	r.add("enqueue_p99_pruning", ms(all.enqueuePruning.quantile(99)), "ms")
	r.add("guard_p99", ms(all.completion.quantile(99)), "ms")
	r.add("guard_p99_pruning", ms(all.completionPruning.quantile(99)), "ms")
	r.add("prune_rows", float64(all.pruneRows), "")
	r.add("prune_pass_p99", ms(all.prunePasses.quantile(99)), "ms")
	r.add("prune_pass_max", ms(all.prunePasses.quantile(100)), "ms")
	r.add("prune_pass_rows_max", float64(all.prunePassRowsMax), "")
	r.add("prune_batch_p99", ms(all.pruneBatches.quantile(99)), "ms")
	r.add("redis_bytes_first", float64(first.RedisBytes), "B")
	r.add("redis_bytes_last", float64(last.RedisBytes), "B")
	r.add("outbox_bytes_first", float64(first.OutboxBytes), "B")
	r.add("outbox_bytes_last", float64(last.OutboxBytes), "B")
	r.add("outbox_bytes_max", most(func(s soakSample) int64 { return s.OutboxBytes }), "B")
	r.add("dead_tuples_max", most(func(s soakSample) int64 { return s.DeadTuples }), "")
	r.add("autovacuums", float64(last.Autovacuums), "")
	r.add("go_heap_bytes_first", float64(first.HeapBytes), "B")
	r.add("go_heap_bytes_last", float64(last.HeapBytes), "B")
	r.add("goroutines_first", float64(first.Goroutines), "")
	r.add("goroutines_last", float64(last.Goroutines), "")
	return nil
}

// tracedPool opens a pool of the session's database with tracer on its
// connections.
func (s *session) tracedPool(ctx context.Context, conns int32, tracer pgx.QueryTracer) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(s.env.DatabaseURL)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = conns
	pcfg.ConnConfig.RuntimeParams["search_path"] = s.schema
	pcfg.ConnConfig.Tracer = tracer
	return pgxpool.NewWithConfig(ctx, pcfg)
}

// outboxSizes reads the outbox's sizes and vacuum counters into smp.
func (s *session) outboxSizes(ctx context.Context, smp *soakSample) error {
	table := taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()
	err := s.pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass), pg_relation_size($1::regclass),
		COALESCE(st.n_live_tup, 0), COALESCE(st.n_dead_tup, 0), COALESCE(st.autovacuum_count, 0), st.last_autovacuum
		FROM (SELECT 1) AS one LEFT JOIN pg_stat_user_tables st ON st.relid = $1::regclass`, table).
		Scan(&smp.OutboxBytes, &smp.OutboxHeapBytes, &smp.LiveTuples, &smp.DeadTuples, &smp.Autovacuums, &smp.LastAutovacuum)
	if err != nil {
		return err
	}
	rows, err := s.pool.Query(ctx, `SELECT c.relname::text, pg_relation_size(i.indexrelid)
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass`, table)
	if err != nil {
		return err
	}
	smp.IndexBytes = map[string]int64{}
	var name string
	var size int64
	_, err = pgx.ForEachRow(rows, []any{&name, &size}, func() error {
		smp.IndexBytes[strings.TrimPrefix(name, "delayq_outbox_")] = size
		return nil
	})
	return err
}

// failsOnce tells the tasks whose first attempt the soak's handler fails: one in 20.
func failsOnce(id string) bool {
	h := fnv.New32a()
	h.Write([]byte(id))
	return h.Sum32()%20 == 0
}

// soakQueueConfig is the soak queue's: its retry backoff, and 32 slots committing
// each run alone, or 256 slots committing up to group runs a transaction.
func soakQueueConfig(group int) delayq.QueueConfig {
	qc := delayq.QueueConfig{Concurrency: 32, Backoff: delayq.Backoff{Base: 100 * time.Millisecond, Max: time.Second}}
	if group > 0 {
		qc.Concurrency, qc.GroupCommit = 256, delayq.GroupCommit{MaxTasks: group}
	}
	return qc
}
