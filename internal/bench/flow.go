package bench

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// fill puts n rows into the outbox, due after delay, with EnqueueMany.
func (s *session) fill(ctx context.Context, n int, delay time.Duration) error {
	tasks := make([]outbox.Task, 0, 10_000)
	for i := 0; i < n; i += 10_000 {
		tasks = tasks[:0]
		for j := i; j < min(i+10_000, n); j++ {
			tasks = append(tasks, outbox.Task{Queue: "bench", ID: fmt.Sprintf("task-%d", j), Payload: payload20, Delay: delay})
		}
		if _, err := s.ob.EnqueueMany(ctx, s.pool, tasks); err != nil {
			return err
		}
	}
	return nil
}

// startRelay runs a relay with default settings until the returned stop.
func (s *session) startRelay(ctx context.Context) (stop func() error, err error) {
	rl, err := relay.New(s.pool, s.dq.AsRedis(), relay.Config{Schema: s.schema})
	if err != nil {
		return nil, err
	}
	return s.background(ctx, rl.Run), nil
}

// background runs f until stop cancels it and returns its error.
func (s *session) background(ctx context.Context, f func(context.Context) error) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	return func() error {
		cancel()
		return <-done
	}
}

// waitFor polls cond every 2ms until it holds or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// stopAll stops every one of stops, in order, and returns err, or else the first
// error a stop returned.
func stopAll(err error, stops []func() error) error {
	for _, stop := range stops {
		if serr := stop(); err == nil {
			err = serr
		}
	}
	return err
}

// queueBacklog is how many tasks, due now, a workload puts in one queue.
type queueBacklog struct {
	queue string
	n     int
	// priority, when set, is the priority of task j (outbox.Task.Priority).
	priority func(j int) int
}

// fillBacklogs writes each queue's tasks (ids task-0, task-1, ...) into the
// outbox in batches of 10,000 and has the relay move all of them to Redis, so a
// workload's workers start with every backlog in place.
func (s *session) fillBacklogs(ctx context.Context, backlogs ...queueBacklog) error {
	tasks := make([]outbox.Task, 0, 10_000)
	for _, b := range backlogs {
		for i := 0; i < b.n; i += 10_000 {
			tasks = tasks[:0]
			for j := i; j < min(i+10_000, b.n); j++ {
				t := outbox.Task{Queue: b.queue, ID: fmt.Sprintf("task-%d", j), Payload: payload20}
				if b.priority != nil {
					t.Priority = b.priority(j)
				}
				tasks = append(tasks, t)
			}
			if _, err := s.ob.EnqueueMany(ctx, s.pool, tasks); err != nil {
				return err
			}
		}
	}
	stopRelay, err := s.startRelay(ctx)
	if err != nil {
		return err
	}
	// Every row pending before is in Redis once none is pending (rows queued by an
	// earlier phase of the workload are counted in neither).
	err = waitFor(ctx, 5*time.Minute, "tasks in Redis", func() (bool, error) {
		n, err := s.countState(ctx, delayqtype.StatePending)
		return n == 0, err
	})
	if serr := stopRelay(); err == nil {
		err = serr
	}
	return err
}

func (s *session) countState(ctx context.Context, state delayqtype.State) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()+" WHERE state = $1", state).Scan(&n)
	return n, err
}

// relayBench: a backlog of pending rows due now drained into Redis, then the lag
// from a producer's commit to the task's arrival in Redis under a steady load.
func relayBench(ctx context.Context, s *session, r *Result) error {
	n := s.n(100_000)
	r.Params["backlog"] = n
	if err := s.fill(ctx, n, 0); err != nil {
		return err
	}
	start := time.Now()
	stop, err := s.startRelay(ctx)
	if err != nil {
		return err
	}
	// Done when Redis holds every task and the round that wrote the last of them
	// has committed: rows are queued only then.
	err = waitFor(ctx, 10*time.Minute, "the backlog to reach Redis", func() (bool, error) {
		st, err := s.dq.Stats(ctx, "bench")
		return st.Ready >= int64(n), err
	})
	if err == nil {
		err = waitFor(ctx, time.Minute, "the last round to commit", func() (bool, error) {
			q, err := s.countState(ctx, delayqtype.StateQueued)
			return q == n, err
		})
	}
	elapsed := time.Since(start)
	if err != nil {
		_ = stop()
		return err
	}
	r.add("relay_backlog", float64(n)/elapsed.Seconds(), "rows/s")
	r.Checks = map[string]int64{"backlog_in_redis": int64(n), "queued_in_outbox": int64(n)}

	// The steady phase starts on a vacuumed table: the backlog left 100,000 dead row
	// versions, which autovacuum would otherwise clean at a random moment of it.
	if _, err := s.pool.Exec(ctx, "VACUUM (ANALYZE) "+taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()); err != nil {
		_ = stop()
		return err
	}
	rate := cmp.Or(s.env.RelayRate, 2000)
	cpu0, t0 := s.cpu(ctx), time.Now()
	probes := s.probe(ctx)
	all, lags, err := s.steadyLag(ctx, rate, s.n(rate), s.n(10*rate))
	pgRTT, redisRTT := probes()
	cpu1, steady := s.cpu(ctx), time.Since(t0)
	if serr := stop(); err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	r.Params["steady_rate"], r.Params["steady_tasks"], r.Params["warmup_tasks"] = rate, len(lags), len(all)-len(lags)
	r.add("lag_p50", ms(percentileD(lags, 50)), "ms")
	r.add("lag_p99", ms(percentileD(lags, 99)), "ms")
	r.add("lag_max", ms(percentileD(lags, 100)), "ms")
	r.add("lag_p99_with_start", ms(percentileD(all, 99)), "ms")
	// What the relay's round trips meet under this load, and the CPU the load
	// holds (this process: producers and relay; Postgres; Redis): on shared
	// cores the lag's tail is the wait for a core.
	r.add("probe_postgres_p99", ms(percentileD(pgRTT, 99)), "ms")
	r.add("probe_redis_p99", ms(percentileD(redisRTT, 99)), "ms")
	r.add("probe_postgres_max", ms(percentileD(pgRTT, 100)), "ms")
	r.add("probe_redis_max", ms(percentileD(redisRTT, 100)), "ms")
	if cpu0.self >= 0 && cpu0.postgres >= 0 && cpu0.redis >= 0 {
		used := (cpu1.self - cpu0.self) + (cpu1.postgres - cpu0.postgres) + (cpu1.redis - cpu0.redis)
		r.add("steady_cpu", used.Seconds()/steady.Seconds(), "cores")
	}
	return nil
}

// probe times one Postgres round trip (SELECT 1, on a connection of its own) and
// one Redis PING every 5ms until the returned function is called, which returns
// the latencies sorted.
func (s *session) probe(ctx context.Context) func() (pg, redis []time.Duration) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var pg, rd []time.Duration
	go func() {
		defer close(done)
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return
		}
		defer conn.Release()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			t := time.Now()
			if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
				pg = append(pg, time.Since(t))
			}
			t = time.Now()
			if err := s.rdb.Ping(ctx).Err(); err == nil {
				rd = append(rd, time.Since(t))
			}
		}
	}()
	return func() ([]time.Duration, []time.Duration) {
		cancel()
		<-done
		slices.Sort(pg)
		slices.Sort(rd)
		return pg, rd
	}
}

// steadyLag commits warm and then total tasks at rate per second (each in its own
// transaction, from 8 producers) and measures, per task, commit → task hash
// written in Redis: for every task (all) and for the total after the warm ones
// (steady), which leave out the load's start (the producers' first statements
// prepared, the plans made anew after the vacuum).
// Arrival is observed through Redis keyspace events on HSET, which name the key.
func (s *session) steadyLag(ctx context.Context, rate, warm, total int) (all, steady []time.Duration, err error) {
	total += warm
	old, err := s.rdb.ConfigGet(ctx, "notify-keyspace-events").Result()
	if err != nil {
		return nil, nil, err
	}
	if err := s.rdb.ConfigSet(ctx, "notify-keyspace-events", "Eh").Err(); err != nil {
		return nil, nil, err
	}
	defer s.rdb.ConfigSet(context.WithoutCancel(ctx), "notify-keyspace-events", old["notify-keyspace-events"])
	sub := s.rdb.Subscribe(ctx, "__keyevent@"+fmt.Sprint(s.rdb.Options().DB)+"__:hset")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		return nil, nil, err
	}
	keys, err := dispatch.KeysFor(s.prefix, "bench")
	if err != nil {
		return nil, nil, err
	}
	var (
		mu        sync.Mutex
		committed = make(map[string]time.Time, total)
		arrived   = make(map[string]time.Time, total)
	)
	go func() {
		for msg := range sub.Channel() {
			at := time.Now()
			if id, ok := strings.CutPrefix(msg.Payload, keys.TaskPrefix); ok {
				mu.Lock()
				if _, seen := arrived[id]; !seen {
					arrived[id] = at
				}
				mu.Unlock()
			}
		}
	}()
	// The producers' connections are open before the clock starts: a pool dialing
	// eight backends at once (a process forked for each) would put their start in
	// the first tasks' lag, which is not the relay's.
	conns := make([]*pgxpool.Conn, 0, 8)
	for range 8 {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			for _, c := range conns {
				c.Release()
			}
			return nil, nil, err
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	interval := time.Second / time.Duration(rate)
	begin := time.Now()
	var next atomic.Int64
	err = parallel(8, func() error {
		for {
			i := next.Add(1) - 1
			if i >= int64(total) {
				return nil
			}
			// Pace: task i commits no earlier than begin + i·interval.
			if d := time.Until(begin.Add(time.Duration(i) * interval)); d > 0 {
				time.Sleep(d)
			}
			id := fmt.Sprintf("steady-%d", i)
			if i < int64(warm) {
				id = fmt.Sprintf("warmup-%d", i)
			}
			err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
				// Due in 10s: within the outbox NotifyWithin, so the relay is woken at
				// commit (a task due later is found by its next round instead).
				_, err := s.ob.Enqueue(ctx, tx, outbox.Task{Queue: "bench", ID: id, Payload: payload20, Delay: 10 * time.Second})
				return err
			})
			if err != nil {
				return err
			}
			mu.Lock()
			committed[id] = time.Now()
			mu.Unlock()
		}
	})
	if err != nil {
		return nil, nil, err
	}
	err = waitFor(ctx, time.Minute, "steady tasks in Redis", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return len(arrived) >= total, nil
	})
	if err != nil {
		return nil, nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	all = make([]time.Duration, 0, total)
	steady = make([]time.Duration, 0, total-warm)
	for id, c := range committed {
		// The hash can be written before Commit returned to the producer (the relay
		// is woken at commit): count that as zero lag, not negative.
		lag := max(0, arrived[id].Sub(c))
		all = append(all, lag)
		if strings.HasPrefix(id, "steady-") {
			steady = append(steady, lag)
		}
	}
	slices.Sort(all)
	slices.Sort(steady)
	return all, steady, nil
}

// drainKind is what a drain workload's handler does.
type drainKind int

const (
	drainTx      drainKind = iota // transactional, writes nothing
	drainTxWrite                  // transactional, inserts one row (writeSQL)
	drainPlain                    // plain, does nothing
)

// writeSQL is drain-tx-write's handler statement ($1 the task id) on the table
// writeDDL makes; bounds runs it too. The table has no index: the insert costs a
// heap tuple and its WAL.
const (
	writeTable = "delayq_bench_effects"
	writeDDL   = "CREATE TABLE " + writeTable + " (task_id text NOT NULL)"
	writeSQL   = "INSERT INTO " + writeTable + " (task_id) VALUES ($1)"
)

// groupCommit is the group-commit workloads' queue setting: groups of up to 64
// tasks, four at once (each on a connection of its own).
var groupCommit = delayq.QueueConfig{Concurrency: 256, GroupCommit: delayq.GroupCommit{MaxTasks: 64}}

// drain: tasks due now already in Redis (and queued in the outbox), 32 handler
// slots (or groupCommit's); tasks per second until every one is done.
func drain(kind drainKind, group bool) func(ctx context.Context, s *session, r *Result) error {
	return func(ctx context.Context, s *session, r *Result) error {
		n := s.n(20_000)
		qc := delayq.QueueConfig{Concurrency: 32}
		if group {
			qc = groupCommit
			r.Params["group_max_tasks"], r.Params["group_max_wait"] = qc.GroupCommit.MaxTasks, qc.WithDefaults().GroupCommit.MaxWait.String()
		}
		r.Params["tasks"], r.Params["concurrency"], r.Params["transactional"] = n, qc.Concurrency, kind != drainPlain
		if kind == drainTxWrite {
			if _, err := s.pool.Exec(ctx, writeDDL); err != nil {
				return err
			}
			r.Params["handler"] = writeSQL
		}
		memBefore, err := s.usedMemory(ctx)
		if err != nil {
			return err
		}
		if err := s.fill(ctx, n, 0); err != nil {
			return err
		}
		stopRelay, err := s.startRelay(ctx)
		if err != nil {
			return err
		}
		err = waitFor(ctx, 5*time.Minute, "tasks in Redis", func() (bool, error) {
			q, err := s.countState(ctx, delayqtype.StateQueued)
			return q == n, err
		})
		if serr := stopRelay(); err == nil {
			err = serr
		}
		if err != nil {
			return err
		}
		var claims claimCounter
		w, err := clientkit.NewClient(s.pool, s.dq, s.ob, delayq.WorkerConfig{Observer: &claims})
		if err != nil {
			return err
		}
		var calls atomic.Int64
		name := "drain_tx"
		switch kind {
		case drainTx:
			err = w.HandleTx("bench", func(context.Context, pgx.Tx, *delayq.Task) error { calls.Add(1); return nil }, qc)
		case drainTxWrite:
			name = "drain_tx_write"
			err = w.HandleTx("bench", func(ctx context.Context, tx pgx.Tx, t *delayq.Task) error {
				calls.Add(1)
				_, err := tx.Exec(ctx, writeSQL, t.ID)
				return err
			}, qc)
		case drainPlain:
			name = "drain_plain"
			err = w.Handle("bench", func(context.Context, *delayq.Task) error { calls.Add(1); return nil }, qc)
		}
		if err != nil {
			return err
		}
		cpuBefore := s.cpu(ctx)
		start := time.Now()
		stop := s.background(ctx, w.Run)
		err = waitFor(ctx, 10*time.Minute, "the drain", func() (bool, error) {
			return w.RunStats().Succeeded >= int64(n), nil
		})
		elapsed := time.Since(start)
		cpuAfter := s.cpu(ctx)
		if serr := stop(); err == nil {
			err = serr
		}
		if err != nil {
			return err
		}
		done, err := s.countState(ctx, delayqtype.StateDone)
		if err != nil {
			return err
		}
		if group {
			name += "_group"
		}
		r.add(name, float64(n)/elapsed.Seconds(), "tasks/s")
		// The drain's CPU per task (the relay stopped before it): the worker in
		// this process, Postgres and Redis.
		r.addCPU("drain", cpuBefore, cpuAfter, n)
		if c := claims.calls.Load(); c > 0 {
			r.add("drain_tasks_per_claim", float64(claims.tasks.Load())/float64(c), "tasks")
		}
		// What the finished tasks left in Redis: their keys (none by default: a
		// task is deleted at its ack), and the server's memory against before.
		left, err := s.taskKeys(ctx, "bench")
		if err != nil {
			return err
		}
		memAfter, err := s.usedMemory(ctx)
		if err != nil {
			return err
		}
		r.add("redis_bytes_per_finished_task", float64(max(memAfter-memBefore, 0))/float64(n), "B")
		r.Checks = map[string]int64{"handler_calls": calls.Load(), "done_in_outbox": int64(done), "redis_task_keys_left": left}
		want := map[string]int64{"handler_calls": int64(n), "done_in_outbox": int64(n), "redis_task_keys_left": 0}
		if kind == drainTxWrite {
			var rows int64
			if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+writeTable).Scan(&rows); err != nil {
				return err
			}
			r.Checks["rows_written"], want["rows_written"] = rows, int64(n)
		}
		if !maps.Equal(r.Checks, want) {
			return fmt.Errorf("checks %v, want %v", r.Checks, want)
		}
		return nil
	}
}

// claimCounter is an Observer counting the claims that leased tasks, and those
// tasks.
type claimCounter struct{ calls, tasks atomic.Int64 }

func (c *claimCounter) Claim(_ context.Context, e delayq.ClaimEvent) {
	if e.Claimed > 0 {
		c.calls.Add(1)
		c.tasks.Add(int64(e.Claimed))
	}
}

func (*claimCounter) RunStart(ctx context.Context, _ *delayq.Task) context.Context { return ctx }
func (*claimCounter) RunEnd(context.Context, *delayq.Task, delayq.RunEndEvent)     {}

// lateness: tasks due 5 s after the workers start, spread evenly over spread,
// going the whole way (outbox, relay, Redis, worker); handler start − due time.
// lateness(2,000, 1 s) is a burst; lateness(25,000, 5 s) drains 5,000 tasks a
// second steadily for 5 s.
func lateness(tasks int, spread time.Duration) func(context.Context, *session, *Result) error {
	return func(ctx context.Context, s *session, r *Result) error {
		return latenessRun(ctx, s, r, s.n(tasks), s.timed(spread))
	}
}

func latenessRun(ctx context.Context, s *session, r *Result, n int, spread time.Duration) error {
	r.Params["tasks"], r.Params["spread"] = n, spread.String()
	w, err := clientkit.NewClient(s.pool, s.dq, s.ob, delayq.WorkerConfig{})
	if err != nil {
		return err
	}
	var st starts
	err = w.Handle("bench", func(_ context.Context, t *delayq.Task) error {
		st.record(t)
		return nil
	}, delayq.QueueConfig{Concurrency: 32})
	if err != nil {
		return err
	}
	stopRelay, err := s.startRelay(ctx)
	if err != nil {
		return err
	}
	defer stopRelay()
	stopWorker := s.background(ctx, w.Run)
	defer stopWorker()
	first := time.Now().Add(s.timed(5 * time.Second))
	step := spread / time.Duration(n)
	tasks := make([]outbox.Task, n)
	for i := range tasks {
		tasks[i] = outbox.Task{Queue: "bench", ID: fmt.Sprintf("late-%d", i), Payload: payload20,
			RunAt: first.Add(time.Duration(i) * step)}
	}
	if _, err := s.ob.EnqueueMany(ctx, s.pool, tasks); err != nil {
		return err
	}
	err = waitFor(ctx, 2*time.Minute, "every task to run", func() (bool, error) {
		return w.RunStats().Succeeded >= int64(n), nil
	})
	if err != nil {
		return err
	}
	lates, early := st.sorted()
	r.add("lateness_p50", ms(percentileD(lates, 50)), "ms")
	r.add("lateness_p95", ms(percentileD(lates, 95)), "ms")
	r.add("lateness_p99", ms(percentileD(lates, 99)), "ms")
	r.add("lateness_max", ms(percentileD(lates, 100)), "ms")
	r.add("started_early", float64(early), "tasks")
	r.Checks = map[string]int64{"ran": int64(len(lates)), "early": early}
	if len(lates) != n || early != 0 {
		return fmt.Errorf("ran %d of %d, %d early", len(lates), n, early)
	}
	return nil
}

// starts records how late handlers start: handler start − due time.
type starts struct {
	mu    sync.Mutex
	lates []time.Duration
	early int64 // claimed before the due time, or started before it
}

// record is called first thing in a handler.
func (s *starts) record(t *delayq.Task) {
	late := time.Since(t.Due)
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.ClaimedAt.Before(t.Due) || late < 0 {
		s.early++
	}
	s.lates = append(s.lates, late)
}

// sorted returns the lateness of every start recorded, ascending, and how many
// were early.
func (s *starts) sorted() ([]time.Duration, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	slices.Sort(s.lates)
	return s.lates, s.early
}

// idle: Redis commands per second from one idle worker and one idle relay, read
// from the server's own command counter.
func idle(ctx context.Context, s *session, r *Result) error {
	window := 10 * time.Second
	if s.env.Scale < 1 {
		window = 2 * time.Second
	}
	r.Params["window"] = window.String()
	w, err := clientkit.NewClient(s.pool, s.dq, s.ob, delayq.WorkerConfig{})
	if err != nil {
		return err
	}
	if err := w.Handle("bench", func(context.Context, *delayq.Task) error { return nil }, delayq.QueueConfig{}); err != nil {
		return err
	}
	// One task far in the future: a worker with something scheduled, not an empty queue.
	if err := s.fill(ctx, 1, time.Hour); err != nil {
		return err
	}
	stopRelay, err := s.startRelay(ctx)
	if err != nil {
		return err
	}
	if err := waitFor(ctx, time.Minute, "the task in Redis", func() (bool, error) {
		q, err := s.countState(ctx, delayqtype.StateQueued)
		return q == 1, err
	}); err != nil {
		_ = stopRelay()
		return err
	}
	relayRate, err := s.commandRate(ctx, window)
	if serr := stopRelay(); err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	stopWorker := s.background(ctx, w.Run)
	time.Sleep(500 * time.Millisecond) // let it subscribe and make its first claim
	workerRate, err := s.commandRate(ctx, window)
	if serr := stopWorker(); err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	r.add("idle_relay", relayRate, "commands/s")
	r.add("idle_worker", workerRate, "commands/s")
	return nil
}

// commandRate is total_commands_processed over window, less this call's own INFOs.
func (s *session) commandRate(ctx context.Context, window time.Duration) (float64, error) {
	read := func() (int64, error) {
		info, err := s.rdb.Info(ctx, "stats").Result()
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
				var n int64
				_, err := fmt.Sscan(v, &n)
				return n, err
			}
		}
		return 0, fmt.Errorf("INFO stats has no total_commands_processed")
	}
	a, err := read()
	if err != nil {
		return 0, err
	}
	time.Sleep(window) // the measurement window itself
	b, err := read()
	if err != nil {
		return 0, err
	}
	return float64(b-a-1) / window.Seconds(), nil
}

func percentileD(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[(len(sorted)-1)*p/100]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// taskKeys counts what Redis holds of queue's tasks: task hashes and ZSET members.
func (s *session) taskKeys(ctx context.Context, queue string) (int64, error) {
	k, err := s.dq.Keys(queue)
	if err != nil {
		return 0, err
	}
	var n int64
	iter := s.rdb.Scan(ctx, 0, k.TaskPrefix+"*", 5000).Iterator()
	for iter.Next(ctx) {
		n++
	}
	if err := iter.Err(); err != nil {
		return 0, err
	}
	for _, z := range []string{k.Ready, k.Active, k.Dead} {
		c, err := s.rdb.ZCard(ctx, z).Result()
		if err != nil {
			return 0, err
		}
		n += c
	}
	return n, nil
}
