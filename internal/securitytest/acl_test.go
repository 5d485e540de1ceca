package securitytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// The least Redis permissions of the relay and of the workers: the commands they
// send (EVALSHA, EVAL when a script is not cached, SCRIPT LOAD for the relay's
// pipelined enqueue, SUBSCRIBE for the workers' wake-ups, PING for readiness)
// and every command their Lua scripts call, which Redis checks against the ACL
// too. docs/SECURITY.md shows these lines (TestSecurityDocACL keeps them equal).
var (
	// relayCommands: scripts enqueue, reap, inspect, probe and repair (settling
	// tasks out of attempts, self-healing); SADD and SMEMBERS for the queue
	// registry; GET, SET and INFO for the epoch marks of loss detection; TIME and
	// ZCOUNT for the overdue gauge.
	// SREM, EXISTS, HGET, HINCRBY and ZPOPMIN: the concurrency keys (a slot given
	// back by reap, repair or a replacing enqueue readmits a parked task).
	// INCRBY and DECRBY: a fair queue's count of parked tasks.
	relayCommands = []string{"ping", "evalsha", "eval", "script|load", "sadd", "smembers", "srem", "get", "set", "info",
		"del", "exists", "hdel", "hexists", "hget", "hincrby", "hmget", "hset", "incrby", "decrby", "persist", "pttl", "publish", "time", "zadd", "zcount",
		"zpopmin", "zrange", "zrem", "zscore"}
	// workerCommands: scripts claim, extend, complete, retry, kill, release, the
	// process registry's workerbeat and workerbye; SADD for the queue registry (its
	// queues, at start).
	// SREM, EXISTS, HGET, ZCARD, ZPOPMIN and ZREMRANGEBYSCORE: the claim's caps
	// and throttles per concurrency key.
	// INCRBY and DECRBY: a fair queue's count of parked tasks.
	workerCommands = []string{"ping", "evalsha", "eval", "subscribe", "sadd", "srem",
		"del", "exists", "hdel", "hget", "hincrby", "hmget", "hset", "incrby", "decrby", "pexpire", "publish", "time", "zadd", "zcard", "zpopmin",
		"zrange", "zremrangebyscore", "zrem", "zscore"}
	// operatorCommands: the commands reconcile, check, stats, dead and cancel
	// (scripts probe, repair, remove, stats; SCAN and ZSCAN to list what Redis holds),
	// and HGETALL for the dashboard's per-minute history; script workers lists
	// the worker processes.
	// SREM, EXISTS, HGET, HINCRBY and ZPOPMIN: a change of the limits per key, a
	// cancel or a repair readmits parked tasks.
	// GET, INCRBY and DECRBY: a fair queue's count of parked tasks (stats reads it).
	operatorCommands = []string{"ping", "evalsha", "eval", "scan", "zscan", "smembers", "srem",
		"del", "exists", "get", "hexists", "hget", "hgetall", "hincrby", "hmget", "hset", "incrby", "decrby", "publish", "time", "zadd", "zcard", "zcount",
		"zpopmin", "zrange", "zrem", "zscore"}
)

// aclRules are the ACL rules (after "user NAME on >PASSWORD") that give a user the
// commands on the keys and channels of one key prefix, and nothing else.
func aclRules(prefix string, commands []string) []string {
	r := []string{"resetkeys", "~" + prefix + ":*", "resetchannels", "&" + prefix + ":*", "-@all"}
	for _, c := range commands {
		r = append(r, "+"+c)
	}
	return r
}

// aclLine is the ACL file / redis.conf line of a user.
func aclLine(name, password, prefix string, commands []string) string {
	return strings.Join(append([]string{"user", name, "on", ">" + password}, aclRules(prefix, commands)...), " ")
}

// aclServerArgs are the redis-server arguments that create the user.
func aclServerArgs(name, password, prefix string, commands []string) []string {
	return append([]string{"--user", name, "on", ">" + password}, aclRules(prefix, commands)...)
}

// aclLog returns the entries of ACL LOG, one line each.
func aclLog(t *testing.T, admin *redis.Client) []string {
	t.Helper()
	v, err := admin.Do(context.Background(), "ACL", "LOG").Slice()
	if err != nil {
		t.Fatalf("ACL LOG: %v", err)
	}
	var out []string
	for _, e := range v {
		m, ok := e.(map[any]any)
		if !ok {
			out = append(out, fmt.Sprint(e))
			continue
		}
		out = append(out, fmt.Sprintf("user=%v reason=%v object=%v context=%v", m["username"], m["reason"], m["object"], m["context"]))
	}
	return out
}

func userClient(t *testing.T, addr, user, password string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: password})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestLeastPrivilegeACL runs the relay and a worker as Redis users holding only
// relayCommands and workerCommands on their prefix, through every script they
// have: enqueue (also after SCRIPT FLUSH, so SCRIPT LOAD and EVAL), claim,
// heartbeats, complete, retry, kill and its mirror to Postgres, a reaped lease,
// a release at shutdown, the worker process registry's beats and goodbye (listed
// by an operator user holding operatorCommands). Every task ends where it should
// and Redis refused nothing (ACL LOG stays empty). Then commands, keys and channels outside the
// set are refused.
func TestLeastPrivilegeACL(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t, 2*time.Minute)
	const (
		prefix     = "sec"
		adminPW    = "admin-pw-0a1b"
		relayPW    = "relay-pw-2c3d"
		workerPW   = "worker-pw-4e5f"
		operatorPW = "operator-pw-6a7b"
	)
	args := []string{"--requirepass", adminPW}
	args = append(args, aclServerArgs("delayq-relay", relayPW, prefix, relayCommands)...)
	args = append(args, aclServerArgs("delayq-worker", workerPW, prefix, workerCommands)...)
	args = append(args, aclServerArgs("delayq-operator", operatorPW, prefix, operatorCommands)...)
	srv := testenv.OwnRedis(t, args...)
	admin := userClient(t, srv.Addr(), "default", adminPW)
	relayRDB := userClient(t, srv.Addr(), "delayq-relay", relayPW)
	workerRDB := userClient(t, srv.Addr(), "delayq-worker", workerPW)
	if entries := aclLog(t, admin); len(entries) != 0 {
		t.Fatalf("ACL LOG not empty at the start: %v", entries)
	}

	pgURL := testenv.PostgresURL(t)
	producer := testenv.Pool(t, pgURL)
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	adminDQ, err := dispatch.New(admin, dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	relayDQ, err := dispatch.New(relayRDB, dispatch.Config{Prefix: prefix,
		ReapBackoffBase: 10 * time.Millisecond, ReapBackoffMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	workerDQ, err := dispatch.New(workerRDB, dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	enqueue := func(queue, id string) {
		t.Helper()
		if _, err := ob.Enqueue(ctx, producer, outbox.Task{Queue: queue, ID: id, Payload: []byte(id)}); err != nil {
			t.Fatal(err)
		}
	}
	state := func(queue, id string) string {
		var s string
		if err := producer.QueryRow(ctx, `SELECT state FROM delayq_outbox WHERE queue = $1 AND task_id = $2`, queue, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	redisState := func(queue, id string) dispatch.TaskInfo {
		info, err := adminDQ.Inspect(ctx, queue, id)
		if err != nil {
			t.Fatal(err)
		}
		return info[0]
	}

	// The relay, as user delayq-relay.
	rl, err := relay.New(testenv.Pool(t, pgURL), relayDQ.AsRedis(), relay.Config{
		PollInterval: 100 * time.Millisecond, ReapInterval: 100 * time.Millisecond,
		Retention: -1, StatsInterval: -1, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- rl.Run(relayCtx) }()
	defer func() {
		stopRelay()
		if err := <-relayDone; err != nil {
			t.Errorf("relay Run: %v", err)
		}
	}()

	// A worker that crashes holding a lease: claimed as delayq-worker, never
	// settled; the relay's reaper takes it back.
	enqueue("crashed", "c-1")
	waitFor(t, 30*time.Second, "c-1 in Redis", func() bool { return redisState("crashed", "c-1").State == dispatch.StateReady })
	cl, err := workerDQ.Claim(ctx, "crashed", 1, 100*time.Millisecond)
	if err != nil || len(cl.Tasks) != 1 {
		t.Fatalf("claim c-1 as the worker user: %+v %v", cl, err)
	}

	// Scripts flushed: the relay's next pipelined enqueue needs SCRIPT LOAD, every
	// other first call falls back from EVALSHA to EVAL.
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		enqueue("ok", fmt.Sprintf("ok-%d", i))
	}
	enqueue("ok", "ok-long")
	enqueue("flaky", "f-1")
	enqueue("doomed", "d-1")
	enqueue("hang", "h-1")

	// The worker, as user delayq-worker.
	w, err := clientkit.NewClient(testenv.Pool(t, pgURL), workerDQ, ob, delayq.WorkerConfig{
		Lease: 600 * time.Millisecond, HeartbeatInterval: 150 * time.Millisecond,
		ShutdownTimeout: -1, ErrorPause: 50 * time.Millisecond, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		ran     = map[string]int{}
		hanging = make(chan struct{})
	)
	count := func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		ran[id]++
		return ran[id]
	}
	fast := delayq.QueueConfig{Backoff: delayq.Backoff{Base: 10 * time.Millisecond, Max: 20 * time.Millisecond}}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(w.Handle("ok", func(ctx context.Context, task *delayq.Task) error {
		count(task.ID)
		if task.ID == "ok-long" { // outlives two leases: heartbeats must extend it
			select {
			case <-time.After(1500 * time.Millisecond):
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		return nil
	}, fast))
	must(w.Handle("flaky", func(ctx context.Context, task *delayq.Task) error {
		if count(task.ID) == 1 {
			return errors.New("first run fails")
		}
		return nil
	}, fast))
	must(w.Handle("doomed", func(ctx context.Context, task *delayq.Task) error {
		count(task.ID)
		return delayq.NoRetry(errors.New("never works"))
	}, fast))
	must(w.Handle("crashed", func(ctx context.Context, task *delayq.Task) error {
		count(task.ID)
		return nil
	}, fast))
	must(w.Handle("hang", func(ctx context.Context, task *delayq.Task) error {
		count(task.ID)
		close(hanging)
		<-ctx.Done()
		return context.Cause(ctx)
	}, fast))
	workerCtx, stopWorker := context.WithCancel(ctx)
	workerDone := make(chan error, 1)
	go func() { workerDone <- w.Run(workerCtx) }()

	done := func(queue, id string) func() bool { return func() bool { return state(queue, id) == "done" } }
	for i := range 4 {
		waitFor(t, 30*time.Second, "ok task done", done("ok", fmt.Sprintf("ok-%d", i)))
	}
	waitFor(t, 30*time.Second, "ok-long done", done("ok", "ok-long"))
	waitFor(t, 30*time.Second, "f-1 done", done("flaky", "f-1"))
	waitFor(t, 30*time.Second, "c-1 reaped and done", done("crashed", "c-1"))
	waitFor(t, 30*time.Second, "d-1 dead", func() bool { return state("doomed", "d-1") == "dead" })
	select {
	case <-hanging:
	case <-time.After(30 * time.Second):
		t.Fatal("h-1 never started")
	}
	// The worker's registry beats went through (listed, as the operator user,
	// with h-1 in flight); its goodbye too (gone after Run).
	operatorRDB := userClient(t, srv.Addr(), "delayq-operator", operatorPW)
	operatorDQ, err := dispatch.New(operatorRDB, dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	listed := func() []string {
		ws, err := operatorDQ.Workers(ctx)
		if err != nil {
			t.Fatalf("list the workers as the operator user: %v", err)
		}
		var runs []string
		for _, w := range ws {
			for _, r := range w.Running {
				runs = append(runs, w.ID+" "+r.ID)
			}
			if len(w.Running) == 0 {
				runs = append(runs, w.ID)
			}
		}
		return runs
	}
	waitFor(t, 30*time.Second, "the worker registered with h-1 in flight", func() bool {
		runs := listed()
		return len(runs) == 1 && strings.HasSuffix(runs[0], " h-1")
	})
	stopWorker()
	if err := <-workerDone; err != nil {
		t.Fatalf("worker Run: %v", err)
	}
	if runs := listed(); len(runs) != 0 {
		t.Errorf("the worker is still registered after Run: %v", runs)
	}
	if info := redisState("hang", "h-1"); info.State != dispatch.StateReady {
		t.Errorf("h-1 after shutdown: %+v, want released to ready", info)
	}
	if info := redisState("doomed", "d-1"); info.State != dispatch.StateDead {
		t.Errorf("d-1 in Redis: %+v, want dead", info)
	}
	mu.Lock()
	if ran["ok-long"] != 1 || ran["f-1"] != 2 || ran["d-1"] != 1 || ran["c-1"] != 1 {
		t.Errorf("runs: %v; want ok-long once (heartbeats held its lease), f-1 twice, d-1 and c-1 once", ran)
	}
	mu.Unlock()
	if entries := aclLog(t, admin); len(entries) != 0 {
		t.Fatalf("Redis refused commands of the relay or the worker:\n%s", strings.Join(entries, "\n"))
	}

	// Outside the set: refused.
	refused := func(who string, c *redis.Client, args ...any) {
		t.Helper()
		err := c.Do(ctx, args...).Err()
		// Outside a script: NOPERM. Inside: "The user executing the script can't
		// run this command", "can't access", "can't publish".
		if err == nil || !strings.Contains(err.Error(), "NOPERM") && !strings.Contains(err.Error(), "user executing the script can't") {
			t.Errorf("%s: %v: %v, want a permission error", who, args, err)
		}
	}
	for _, c := range []struct {
		who string
		rdb *redis.Client
	}{{"relay", relayRDB}, {"worker", workerRDB}} {
		refused(c.who, c.rdb, "FLUSHALL")
		refused(c.who, c.rdb, "KEYS", "*")
		refused(c.who, c.rdb, "CONFIG", "GET", "maxmemory")
		refused(c.who, c.rdb, "ACL", "LIST")
		refused(c.who, c.rdb, "APPEND", prefix+":x", "1")                   // a command not in the set
		refused(c.who, c.rdb, "HSET", "other:{q}:t:x", "s", "r")            // a key outside the prefix
		refused(c.who, c.rdb, "EVAL", "return redis.call('FLUSHALL')", "0") // through a script
		refused(c.who, c.rdb, "EVAL", "return redis.call('HSET', KEYS[1], 'f', 'v')", "1", "other:x")
		refused(c.who, c.rdb, "EVAL", "return redis.call('PUBLISH', 'other:wake', 'x')", "0") // a channel outside
		refused(c.who, c.rdb, "SCAN", "0")
	}
	// A read outside each one's set (the worker counts a key's runs with ZCARD
	// for the caps per concurrency key; the relay has no use for it).
	refused("relay", relayRDB, "ZCARD", prefix+":{ok}:ready")
	refused("worker", workerRDB, "ZCOUNT", prefix+":{ok}:ready", "-inf", "+inf")
	refused("relay", relayRDB, "SUBSCRIBE", prefix+":{ok}:wake")
	refused("worker", workerRDB, "SCRIPT", "FLUSH")
	ps := workerRDB.Subscribe(ctx, "other:{ok}:wake")
	if _, err := ps.Receive(ctx); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("worker SUBSCRIBE to a channel outside its prefix: %v, want NOPERM", err)
	}
	_ = ps.Close()
	if entries := aclLog(t, admin); len(entries) == 0 {
		t.Error("ACL LOG stayed empty after refused commands: the check above proves nothing")
	}
}
