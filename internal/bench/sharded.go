package bench

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/tempserver"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// The sharded workload (issue 22, item 5): does a hot queue split into shards
// spread its Redis load over a cluster's masters? A Redis Cluster of its own, 3
// masters with a replica each (redis-cli's equal runs of slots); one queue of
// 50,000 tasks due now, enqueued through the outbox and moved by the relay, then
// drained by one worker with a plain no-op handler (32 slots, as drain-plain).
// Three times: the queue in one shard (all its keys on one master: the
// contrast), then in Env.Shards shards (default 3), then in as many shards with 32
// slots a shard (a claim asks every shard for a share of its slots, so this one's
// claims carry as many tasks a shard as the unsharded queue's). For the relay's
// move and for the drain, each
// master's delayq commands (INFO commandstats, less the servers' own chatter and
// this workload's INFO calls) before and after: every master's share, the largest
// deviation from the mean in %, commands a second per master, Redis CPU a task.
// The counts are checked: every task in the shard ShardOf names (its hash on the
// master owning that shard's slot), every task run once, done in the outbox,
// nothing left in Redis. A routing bug fails the run.

// shardedMasters is the number of masters of the workload's cluster.
const shardedMasters = 3

// defaultShards is the sharded phase's shard count when Env.Shards is 0.
const defaultShards = 3

// shardRig is the workload's cluster: the client the relay and worker use, and a
// client on each master for its counters.
type shardRig struct {
	cl      *tempserver.RedisCluster
	rdb     *redis.ClusterClient
	dq      *dispatch.Client
	masters []*redis.Client // in the order of cl.Masters: by slot range
	addrs   []string
}

func (g *shardRig) close() {
	for _, m := range g.masters {
		_ = m.Close()
	}
	_ = g.rdb.Close()
	g.cl.Close()
}

// masterOf returns the index in g.masters of the master serving key.
func (g *shardRig) masterOf(ctx context.Context, key string) (int, error) {
	m, err := g.cl.MasterFor(ctx, key)
	if err != nil {
		return 0, err
	}
	for i, a := range g.addrs {
		if a == m.Addr() {
			return i, nil
		}
	}
	return 0, fmt.Errorf("master %s of %q is not one of %v", m.Addr(), key, g.addrs)
}

func sharded(ctx context.Context, s *session, r *Result) error {
	shards := s.env.Shards
	if shards == 0 {
		shards = defaultShards
	}
	if shards < 1 || shards > dispatch.MaxShards {
		return fmt.Errorf("shards %d: want 1..%d", shards, dispatch.MaxShards)
	}
	n := s.n(50_000)
	r.Params["tasks"], r.Params["shards"], r.Params["masters"] = n, shards, shardedMasters
	cl, err := tempserver.StartRedisCluster(ctx, shardedMasters)
	if err != nil {
		return err
	}
	g := &shardRig{cl: cl, rdb: redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), PoolSize: 64})}
	defer g.close()
	if g.dq, err = dispatch.New(g.rdb, dispatch.Config{Prefix: s.prefix}); err != nil {
		return err
	}
	ms, err := cl.Masters(ctx)
	if err != nil {
		return err
	}
	if len(ms) != shardedMasters {
		return fmt.Errorf("%d masters serve slots, want %d", len(ms), shardedMasters)
	}
	for _, m := range ms {
		g.masters = append(g.masters, redis.NewClient(&redis.Options{Addr: m.Addr()}))
		g.addrs = append(g.addrs, m.Addr())
	}
	r.Checks = map[string]int64{}
	want := map[string]int64{}
	// A claim asks every shard for a share of its slots, so the third phase gives
	// the worker 32 slots a shard: claims as large a shard as the unsharded one's.
	for _, ph := range []shardPhase{{"flat", "flat", 1, 32}, {"sharded", "hot", shards, 32}, {"sharded_wide", "wide", shards, 32 * shards}} {
		if err := s.shardPhase(ctx, g, r, ph, n, want); err != nil {
			return fmt.Errorf("%s (%d shards): %w", ph.name, ph.shards, err)
		}
	}
	if !maps.Equal(r.Checks, want) {
		return fmt.Errorf("checks %v, want %v", r.Checks, want)
	}
	return nil
}

// setShards splits queue into n shards before any of its tasks exists: in
// Postgres, the truth the relay mirrors, then in Redis, where the clients read it.
func (s *session) setShards(ctx context.Context, dq *dispatch.Client, queue string, n int) error {
	c, err := queuectl.New(s.pool, dq, s.ob.Config().Schema)
	if err == nil {
		_, err = c.SetShards(ctx, queue, n)
	}
	return err
}

// setRateLimit sets queue's rate limit in both stores.
func (s *session) setRateLimit(ctx context.Context, queue string, rate validate.RateLimit) (queuectl.Control, error) {
	c, err := queuectl.New(s.pool, s.dq, s.ob.Config().Schema)
	if err != nil {
		return queuectl.Control{}, err
	}
	return c.SetRateLimit(ctx, queue, rate)
}

// shardPhase is one phase of the sharded workload: its figures' prefix, its
// queue, the queue's shard count, the worker's slots.
type shardPhase struct {
	name, queue   string
	shards, slots int
}

// shardPhase runs one phase of the sharded workload, adding its figures (named
// name_...) and checks to r, and the checks' expected values to want.
func (s *session) shardPhase(ctx context.Context, g *shardRig, r *Result, ph shardPhase, n int, want map[string]int64) error {
	name, queue, shards := ph.name, ph.queue, ph.shards
	r.Params[name+"_concurrency"] = ph.slots
	if shards > 1 {
		if err := s.setShards(ctx, g.dq, queue, shards); err != nil {
			return err
		}
	}
	// Where each shard lives, and where each task must be.
	keys := make([]dispatch.Keys, shards)
	home := make([]int, shards)
	for k := range keys {
		var err error
		if keys[k], err = dispatch.ShardKeys(s.prefix, queue, k, shards); err != nil {
			return err
		}
		if home[k], err = g.masterOf(ctx, keys[k].Ready); err != nil {
			return err
		}
	}
	r.Params[name+"_shard_master"] = home
	ids := make([]string, n)
	perShard := make([]int64, shards)
	tasks := make([]outbox.Task, 0, 10_000)
	for i := 0; i < n; i += 10_000 {
		tasks = tasks[:0]
		for j := i; j < min(i+10_000, n); j++ {
			ids[j] = queue + "-" + strconv.Itoa(j)
			perShard[dispatch.ShardOf(ids[j], shards)]++
			tasks = append(tasks, outbox.Task{Queue: queue, ID: ids[j], Payload: payload20})
		}
		if _, err := s.ob.EnqueueMany(ctx, s.pool, tasks); err != nil {
			return err
		}
	}

	// The relay's move.
	rl, err := relay.New(s.pool, g.dq.AsRedis(), relay.Config{Schema: s.schema})
	if err != nil {
		return err
	}
	before, err := g.counters(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	stopRelay := s.background(ctx, rl.Run)
	err = waitFor(ctx, 5*time.Minute, "tasks in Redis", func() (bool, error) {
		q, err := s.countQueue(ctx, queue, delayqtype.StateQueued)
		return q == n, err
	})
	elapsed := time.Since(start)
	after, cerr := g.counters(ctx)
	if serr := stopRelay(); err == nil {
		err = serr
	}
	if err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	r.add(name+"_relay", float64(n)/elapsed.Seconds(), "rows/s")
	addShares(r, name+"_relay", before, after, n, elapsed)

	// Routing: each task's hash on the master of its shard, each shard's ready
	// set as large as ShardOf says.
	misplaced, err := g.misplaced(ctx, keys, home, ids, perShard)
	if err != nil {
		return err
	}
	r.Checks[name+"_misplaced"], want[name+"_misplaced"] = misplaced, 0

	// The drain.
	w, err := clientkit.NewClient(s.pool, g.dq, s.ob, delayq.WorkerConfig{})
	if err != nil {
		return err
	}
	runs := make([]atomic.Int32, n)
	var unknown atomic.Int64
	err = w.Handle(queue, func(_ context.Context, t *delayq.Task) error {
		j, err := strconv.Atoi(strings.TrimPrefix(t.ID, queue+"-"))
		if err != nil || j < 0 || j >= n {
			unknown.Add(1)
			return nil
		}
		runs[j].Add(1)
		return nil
	}, delayq.QueueConfig{Concurrency: ph.slots})
	if err != nil {
		return err
	}
	if before, err = g.counters(ctx); err != nil {
		return err
	}
	start = time.Now()
	stop := s.background(ctx, w.Run)
	err = waitFor(ctx, 10*time.Minute, "the drain", func() (bool, error) {
		return w.RunStats().Succeeded >= int64(n), nil
	})
	elapsed = time.Since(start)
	after, cerr = g.counters(ctx)
	if serr := stop(); err == nil {
		err = serr
	}
	if err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	r.add(name+"_drain", float64(n)/elapsed.Seconds(), "tasks/s")
	addShares(r, name+"_drain", before, after, n, elapsed)

	var ran, twice int64
	for j := range runs {
		switch c := runs[j].Load(); {
		case c >= 1:
			ran++
			if c > 1 {
				twice++
			}
		}
	}
	done, err := s.countQueue(ctx, queue, delayqtype.StateDone)
	if err != nil {
		return err
	}
	left, err := g.left(ctx, keys, home)
	if err != nil {
		return err
	}
	for k, v := range map[string][2]int64{
		"_ran": {ran, int64(n)}, "_ran_twice": {twice, 0}, "_unknown_ids": {unknown.Load(), 0},
		"_done_in_outbox": {int64(done), int64(n)}, "_redis_keys_left": {left, 0},
	} {
		r.Checks[name+k], want[name+k] = v[0], v[1]
	}
	return nil
}

func (s *session) countQueue(ctx context.Context, queue string, state delayqtype.State) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()+" WHERE queue = $1 AND state = $2", queue, state).Scan(&n)
	return n, err
}

// misplaced counts the tasks whose hash is missing from the master of their
// shard, and the difference between each shard's ready set and the number of
// tasks ShardOf puts in it.
func (g *shardRig) misplaced(ctx context.Context, keys []dispatch.Keys, home []int, ids []string, perShard []int64) (int64, error) {
	var bad int64
	for k := range keys {
		c, err := g.masters[home[k]].ZCard(ctx, keys[k].Ready).Result()
		if err != nil {
			return 0, err
		}
		bad += max(c-perShard[k], perShard[k]-c)
	}
	shards := len(keys)
	for i := 0; i < len(ids); i += 1000 {
		pipes := make([]redis.Pipeliner, len(g.masters))
		var cmds []*redis.IntCmd
		for _, id := range ids[i:min(i+1000, len(ids))] {
			k := dispatch.ShardOf(id, shards)
			m := home[k]
			if pipes[m] == nil {
				pipes[m] = g.masters[m].Pipeline()
			}
			cmds = append(cmds, pipes[m].Exists(ctx, keys[k].TaskKey(id)))
		}
		for _, p := range pipes {
			if p != nil {
				if _, err := p.Exec(ctx); err != nil {
					return 0, err
				}
			}
		}
		for _, c := range cmds {
			if c.Val() != 1 {
				bad++
			}
		}
	}
	return bad, nil
}

// left counts what Redis still holds of the queue's tasks: members of each
// shard's sets and task hashes on its master.
func (g *shardRig) left(ctx context.Context, keys []dispatch.Keys, home []int) (int64, error) {
	var n int64
	for k, ks := range keys {
		m := g.masters[home[k]]
		for _, z := range []string{ks.Ready, ks.Active, ks.Dead} {
			c, err := m.ZCard(ctx, z).Result()
			if err != nil {
				return 0, err
			}
			n += c
		}
		iter := m.Scan(ctx, 0, ks.TaskPrefix+"*", 5000).Iterator()
		for iter.Next(ctx) {
			n++
		}
		if err := iter.Err(); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// masterCounters is one reading of each master's counters.
type masterCounters struct {
	cmds    []int64         // delayq's commands: INFO commandstats without serverCommands
	scripts []int64         // of which script calls (EVALSHA, EVAL); the others run inside them
	cpu     []time.Duration // used_cpu_user + used_cpu_sys
	sys     []time.Duration // used_cpu_sys: the kernel's part
	self    time.Duration   // this process's CPU (relay, worker), -1 unknown
}

// serverCommands are the commands no client of delayq sends on its own: the
// cluster's and the replicas' chatter, the clients' handshakes, these readings.
var serverCommands = map[string]bool{"info": true, "replconf": true, "psync": true, "sync": true, "cluster": true,
	"ping": true, "command": true, "hello": true, "client": true, "readonly": true, "select": true, "auth": true}

// counters reads every master's counters.
func (g *shardRig) counters(ctx context.Context) (masterCounters, error) {
	c := masterCounters{self: -1}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for _, m := range g.masters {
		info, err := m.Info(ctx, "commandstats", "cpu").Result()
		if err != nil {
			return c, err
		}
		var cmds, scripts int64
		var cpu, sys float64
		for _, line := range strings.Split(info, "\r\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_"); ok {
				cmd, stats, _ := strings.Cut(rest, ":")
				calls, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
				v, err := strconv.ParseInt(calls, 10, 64)
				if err != nil {
					return c, fmt.Errorf("INFO commandstats: %q: %w", line, err)
				}
				if !serverCommands[cmd] {
					cmds += v
				}
				if cmd == "evalsha" || cmd == "eval" {
					scripts += v
				}
			}
			for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
				if v, ok := strings.CutPrefix(line, k); ok {
					f, err := strconv.ParseFloat(v, 64)
					if err != nil {
						return c, fmt.Errorf("INFO cpu: %q: %w", line, err)
					}
					cpu += f
					if k == "used_cpu_sys:" {
						sys = f
					}
				}
			}
		}
		c.cmds, c.scripts = append(c.cmds, cmds), append(c.scripts, scripts)
		c.cpu = append(c.cpu, time.Duration(cpu*float64(time.Second)))
		c.sys = append(c.sys, time.Duration(sys*float64(time.Second)))
	}
	return c, nil
}

// addShares adds each master's share of the commands between before and after
// (name_m1_share ...), the largest deviation from the mean share, each master's
// commands a second, commands, script calls and Redis CPU (all masters; and the
// kernel's part of it) a task, and this process's CPU a task (the relay's or the
// worker's).
// INFO commandstats counts the commands a script runs as well as its call.
func addShares(r *Result, name string, before, after masterCounters, tasks int, elapsed time.Duration) {
	var sum, scripts int64
	var cpu, sys time.Duration
	d := make([]int64, len(before.cmds))
	for i := range d {
		d[i] = after.cmds[i] - before.cmds[i]
		sum += d[i]
		scripts += after.scripts[i] - before.scripts[i]
		cpu += after.cpu[i] - before.cpu[i]
		sys += after.sys[i] - before.sys[i]
	}
	if sum == 0 {
		return
	}
	mean := float64(sum) / float64(len(d))
	var dev float64
	for i, v := range d {
		r.add(fmt.Sprintf("%s_m%d_share", name, i+1), 100*float64(v)/float64(sum), "%")
		r.add(fmt.Sprintf("%s_m%d_rate", name, i+1), float64(v)/elapsed.Seconds(), "commands/s")
		dev = max(dev, abs(float64(v)-mean)/mean)
	}
	r.add(name+"_max_deviation", 100*dev, "%")
	r.add(name+"_commands", float64(sum)/float64(tasks), "commands/task")
	r.add(name+"_scripts", float64(scripts)/float64(tasks), "calls/task")
	r.add(name+"_redis_cpu", float64(max(cpu, 0))/float64(time.Microsecond)/float64(tasks), "µs/task")
	if before.self >= 0 && after.self >= 0 {
		r.add(name+"_go_cpu", float64(after.self-before.self)/float64(time.Microsecond)/float64(tasks), "µs/task")
	}
	r.add(name+"_redis_cpu_kernel", float64(max(sys, 0))/float64(time.Microsecond)/float64(tasks), "µs/task")
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}
