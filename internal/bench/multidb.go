package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/tempserver"
	"github.com/delayq/delayq/migrations"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// The multi-db workload (issue 36, item 5): does spreading the outbox over
// several databases (docs/DESIGN.md, "Several databases") cost more per task
// than one? PostgreSQL servers of its own on this machine (fsync on), one per
// database, and a Redis Cluster of its own (3 masters with a replica each). With
// 1, 2 and 4 databases in turn, the same total work split evenly between them:
// enqueue-tx (20,000 tasks due in 1 h, 8 producers in all, a transaction a task)
// and drain-tx (20,000 tasks due now, moved by each database's relay, then run
// by each database's client, 32 slots in all, no-op transactional handler).
// Throughput per database and in total, and CPU per task (this process, every
// Postgres server, every Redis node) beside the one-database phase's. Every
// task is checked: its row in its own database, run once, done.

// multiDBCounts are the database counts of the workload's phases, in order: the
// first is the single database the others are compared with.
var multiDBCounts = []int{1, 2, 4}

// multiDBRig is the workload's servers: a PostgreSQL server and pool per
// database (as many as the largest phase needs), the cluster and its client.
type multiDBRig struct {
	pgs   []*tempserver.Postgres
	pools []*pgxpool.Pool
	cl    *tempserver.RedisCluster
	rdb   *redis.ClusterClient
	nodes []*redis.Client // every cluster node, for INFO cpu
	dirs  []string        // each server's data directory, for its CPU
}

func (g *multiDBRig) close() {
	for _, n := range g.nodes {
		_ = n.Close()
	}
	if g.rdb != nil {
		_ = g.rdb.Close()
	}
	if g.cl != nil {
		g.cl.Close()
	}
	for _, p := range g.pools {
		p.Close()
	}
	for _, pg := range g.pgs {
		pg.Close()
	}
}

func multiDB(ctx context.Context, s *session, r *Result) error {
	n := s.n(20_000)
	r.Params["tasks_per_phase"], r.Params["databases"], r.Params["masters"] = n, multiDBCounts, shardedMasters
	r.Params["producers"], r.Params["slots"] = 8, 32
	g := &multiDBRig{}
	defer g.close()
	if err := g.start(ctx, s, multiDBCounts[len(multiDBCounts)-1]); err != nil {
		return err
	}
	r.Checks = map[string]int64{}
	var base [2]float64 // the single database's CPU per task: enqueue, drain
	for _, k := range multiDBCounts {
		cpu, err := s.multiDBPhase(ctx, g, r, k, n)
		if err != nil {
			return fmt.Errorf("%d databases: %w", k, err)
		}
		if k == multiDBCounts[0] {
			base = cpu
			continue
		}
		// The cost against one database, side by side (100: the same; the target is
		// at most 110).
		r.add(fmt.Sprintf("db%d_enqueue_cpu_of_1db", k), 100*cpu[0]/base[0], "%")
		r.add(fmt.Sprintf("db%d_drain_cpu_of_1db", k), 100*cpu[1]/base[1], "%")
	}
	return nil
}

// start starts dbs PostgreSQL servers, migrated, and the cluster.
func (g *multiDBRig) start(ctx context.Context, s *session, dbs int) error {
	for range dbs {
		pg, err := tempserver.StartPostgres(ctx, tempserver.PostgresOptions{Durable: true})
		if err != nil {
			return err
		}
		g.pgs = append(g.pgs, pg)
		cfg, err := pgxpool.ParseConfig(pg.URL())
		if err != nil {
			return err
		}
		cfg.MaxConns = 48
		cfg.ConnConfig.RuntimeParams["search_path"] = s.schema
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return err
		}
		g.pools = append(g.pools, pool)
		db := migrations.OpenDBFromPool(pool)
		_, err = migrations.Up(ctx, db, migrations.Config{Schema: s.schema})
		_ = db.Close()
		if err != nil {
			return err
		}
		var dir string
		if err := pool.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&dir); err != nil {
			return err
		}
		g.dirs = append(g.dirs, dir)
	}
	cl, err := tempserver.StartRedisCluster(ctx, shardedMasters)
	if err != nil {
		return err
	}
	g.cl = cl
	g.rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), PoolSize: 64})
	for _, a := range cl.Addrs() {
		g.nodes = append(g.nodes, redis.NewClient(&redis.Options{Addr: a}))
	}
	return nil
}

// cpu reads the CPU time of this process, of the first dbs servers and of every
// cluster node (replicas replicate every write: part of the cost).
func (g *multiDBRig) cpu(ctx context.Context, dbs int) (cpuTimes, error) {
	c := cpuTimes{redisCmds: -1, kernel: -1}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return c, err
	}
	c.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	for _, dir := range g.dirs[:dbs] {
		t, _ := postmasterCPU(dir)
		if t < 0 {
			return c, fmt.Errorf("the CPU of the server in %s cannot be read", dir)
		}
		c.postgres += t
	}
	for _, n := range g.nodes {
		info, err := n.Info(ctx, "cpu").Result()
		if err != nil {
			return c, err
		}
		for _, line := range strings.Split(info, "\r\n") {
			for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
				if v, ok := strings.CutPrefix(line, k); ok {
					f, err := strconv.ParseFloat(v, 64)
					if err != nil {
						return c, fmt.Errorf("INFO cpu %q: %w", line, err)
					}
					c.redis += time.Duration(f * float64(time.Second))
				}
			}
		}
	}
	return c, nil
}

// total is the CPU time of the three parts together.
func (c cpuTimes) total() time.Duration { return c.self + c.postgres + c.redis }

// multiDBPhase runs enqueue-tx and drain-tx over k databases and returns their
// CPU per task in µs (all parts together).
func (s *session) multiDBPhase(ctx context.Context, g *multiDBRig, r *Result, k, n int) (cpu [2]float64, err error) {
	name := fmt.Sprintf("db%d", k)
	keys := make([]string, k)
	obs := make([]*outbox.Client, k)
	for i := range k {
		keys[i] = fmt.Sprintf("db%d", i)
		if obs[i], err = outbox.New(outbox.Config{Schema: s.schema}); err != nil {
			return cpu, err
		}
		if _, err := g.pools[i].Exec(ctx, "TRUNCATE delayq_outbox"); err != nil {
			return cpu, err
		}
	}
	share := func(i int) int { // tasks of database i
		if i < n%k {
			return n/k + 1
		}
		return n / k
	}

	// enqueue-tx: 8 producers in all, 8/k on each database.
	var pick atomic.Int64
	before, err := g.cpu(ctx, k)
	if err != nil {
		return cpu, err
	}
	start := time.Now()
	elapsed := make([]time.Duration, k)
	err = parallel(k, func() error {
		i := int(pick.Add(1) - 1)
		var next atomic.Int64
		perr := parallel(8/k, func() error {
			for {
				j := next.Add(1)
				if j > int64(share(i)) {
					return nil
				}
				err := pgx.BeginFunc(ctx, g.pools[i], func(tx pgx.Tx) error {
					_, err := obs[i].Enqueue(ctx, tx, outbox.Task{Queue: "bench", ID: "task-" + strconv.FormatInt(j, 10),
						Payload: payload20, Delay: time.Hour})
					return err
				})
				if err != nil {
					return err
				}
			}
		})
		elapsed[i] = time.Since(start)
		return perr
	})
	total := time.Since(start)
	if err != nil {
		return cpu, err
	}
	after, err := g.cpu(ctx, k)
	if err != nil {
		return cpu, err
	}
	for i := range k {
		r.add(fmt.Sprintf("%s_enqueue_tx_%s", name, keys[i]), float64(share(i))/elapsed[i].Seconds(), "tasks/s")
	}
	r.add(name+"_enqueue_tx_total", float64(n)/total.Seconds(), "tasks/s")
	r.addCPU(name+"_enqueue", before, after, n)
	cpu[0] = float64(after.total()-before.total()) / float64(time.Microsecond) / float64(n)
	r.add(name+"_enqueue_cpu_total", cpu[0], "µs/task")
	for i := range k {
		var rows int64
		if err := g.pools[i].QueryRow(ctx, "SELECT count(*) FROM delayq_outbox").Scan(&rows); err != nil {
			return cpu, err
		}
		r.Checks[fmt.Sprintf("%s_%s_enqueued", name, keys[i])] = rows
		if rows != int64(share(i)) {
			return cpu, fmt.Errorf("%s holds %d rows, want %d", keys[i], rows, share(i))
		}
		if _, err := g.pools[i].Exec(ctx, "TRUNCATE delayq_outbox"); err != nil {
			return cpu, err
		}
	}

	// drain-tx: each database's tasks due now, moved by its relay (untimed),
	// then run by its client: 32/k slots each.
	clients := make([]*delayq.Client, k)
	calls := make([]atomic.Int64, k)
	for i := range k {
		tasks := make([]outbox.Task, 0, share(i))
		for j := range share(i) {
			tasks = append(tasks, outbox.Task{Queue: "bench", ID: "task-" + strconv.Itoa(j), Payload: payload20})
		}
		if _, err := obs[i].EnqueueMany(ctx, g.pools[i], tasks); err != nil {
			return cpu, err
		}
		rl, err := relay.New(g.pools[i], g.rdb, relay.Config{Schema: s.schema, Prefix: s.prefix, Database: keys[i]})
		if err != nil {
			return cpu, err
		}
		stop := s.background(ctx, rl.Run)
		err = waitFor(ctx, 5*time.Minute, "tasks in Redis", func() (bool, error) {
			var q int
			err := g.pools[i].QueryRow(ctx, "SELECT count(*) FROM delayq_outbox WHERE state = 'queued'").Scan(&q)
			return q == share(i), err
		})
		if serr := stop(); err == nil {
			err = serr
		}
		if err != nil {
			return cpu, err
		}
		if clients[i], err = delayq.New(g.pools[i], g.rdb, delayq.Config{Schema: s.schema, Prefix: s.prefix, Database: keys[i]}); err != nil {
			return cpu, err
		}
		err = clients[i].HandleTx("bench", func(context.Context, pgx.Tx, *delayq.Task) error { calls[i].Add(1); return nil },
			delayq.QueueConfig{Concurrency: 32 / k})
		if err != nil {
			return cpu, err
		}
	}
	if before, err = g.cpu(ctx, k); err != nil {
		return cpu, err
	}
	start = time.Now()
	stops := make([]func() error, k)
	for i := range k {
		stops[i] = s.background(ctx, clients[i].Run)
	}
	// One wait over every database, so that each one's end is its own.
	for i := range elapsed {
		elapsed[i] = 0
	}
	err = waitFor(ctx, 10*time.Minute, "the drain", func() (bool, error) {
		left := 0
		for i := range k {
			if elapsed[i] == 0 && clients[i].RunStats().Succeeded >= int64(share(i)) {
				elapsed[i] = time.Since(start)
			}
			if elapsed[i] == 0 {
				left++
			}
		}
		return left == 0, nil
	})
	total = time.Since(start)
	after, cerr := g.cpu(ctx, k)
	if err = stopAll(err, stops); err == nil {
		err = cerr
	}
	if err != nil {
		return cpu, err
	}
	for i := range k {
		r.add(fmt.Sprintf("%s_drain_tx_%s", name, keys[i]), float64(share(i))/elapsed[i].Seconds(), "tasks/s")
	}
	r.add(name+"_drain_tx_total", float64(n)/total.Seconds(), "tasks/s")
	r.addCPU(name+"_drain", before, after, n)
	cpu[1] = float64(after.total()-before.total()) / float64(time.Microsecond) / float64(n)
	r.add(name+"_drain_cpu_total", cpu[1], "µs/task")
	for i := range k {
		var doneRows int64
		if err := g.pools[i].QueryRow(ctx, "SELECT count(*) FROM delayq_outbox WHERE state = 'done'").Scan(&doneRows); err != nil {
			return cpu, err
		}
		r.Checks[fmt.Sprintf("%s_%s_done", name, keys[i])] = doneRows
		r.Checks[fmt.Sprintf("%s_%s_calls", name, keys[i])] = calls[i].Load()
		if doneRows != int64(share(i)) || calls[i].Load() != int64(share(i)) {
			return cpu, fmt.Errorf("%s: %d done, %d handler calls, want %d", keys[i], doneRows, calls[i].Load(), share(i))
		}
	}
	return cpu, nil
}
