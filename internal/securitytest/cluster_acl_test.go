package securitytest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/tempserver"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// clusterCommands are what go-redis's cluster client adds to a user's commands:
// the slot layout (CLUSTER SLOTS), the key positions of commands (COMMAND), and
// ASKING to follow a redirect while a slot moves.
var clusterCommands = []string{"cluster|slots", "cluster|shards", "command", "asking"}

// TestLeastPrivilegeACLOnCluster runs the relay and a worker on a Redis Cluster
// as users holding their ACL plus clusterCommands, on tasks of many queues spread
// over the masters, one of them while its slot is being moved (ASK redirects):
// every task runs and no node refused anything.
func TestLeastPrivilegeACLOnCluster(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t, 3*time.Minute)
	_, cl := testenv.RedisCluster(t)
	const prefix = "secc"
	for _, n := range cl.Nodes {
		c := redis.NewClient(&redis.Options{Addr: n.Addr()})
		for _, u := range []struct {
			name string
			cmds []string
		}{{"delayq-relay", relayCommands}, {"delayq-worker", workerCommands}} {
			args := []any{"ACL", "SETUSER", u.name, "on", ">" + u.name + "-pw"}
			for _, r := range aclRules(prefix, append(append([]string{}, u.cmds...), clusterCommands...)) {
				args = append(args, r)
			}
			if err := c.Do(ctx, args...).Err(); err != nil {
				t.Fatalf("%s: ACL SETUSER: %v", n.Addr(), err)
			}
		}
		if err := c.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	client := func(user string) *redis.ClusterClient {
		opt := testenv.ClusterOptions(cl.Addrs())
		opt.Username, opt.Password = user, user+"-pw"
		c := redis.NewClusterClient(opt)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	relayDQ, err := dispatch.New(client("delayq-relay"), dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	workerDQ, err := dispatch.New(client("delayq-worker"), dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	pgURL := testenv.PostgresURL(t)
	pool := testenv.Pool(t, pgURL)
	ob, _ := outbox.New(outbox.Config{})
	const queues = 12
	for i := range queues {
		if _, err := ob.Enqueue(ctx, pool, outbox.Task{Queue: fmt.Sprintf("q%d", i), ID: "t-1"}); err != nil {
			t.Fatal(err)
		}
	}
	rl, err := relay.New(testenv.Pool(t, pgURL), relayDQ.AsRedis(), relay.Config{PollInterval: 100 * time.Millisecond, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	errs := make(chan error, 2)
	go func() { errs <- rl.Run(runCtx) }()
	defer func() {
		stop()
		for range 2 {
			if err := <-errs; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}()
	waitFor(t, 30*time.Second, "the relay to move every row", func() bool {
		var pending int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE state = 'pending'`).Scan(&pending)
		return pending == 0
	})

	// Move q0's slot half way: its keys are on the target, the source answers ASK.
	keys, err := workerDQ.Keys("q0")
	if err != nil {
		t.Fatal(err)
	}
	slot := tempserver.Slot(keys.Ready)
	from, err := cl.MasterFor(ctx, keys.Ready)
	if err != nil {
		t.Fatal(err)
	}
	masters, err := cl.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	to := masters[0]
	if to == from {
		to = masters[1]
	}
	move, err := cl.BeginSlotMove(ctx, slot, to)
	if err != nil {
		t.Fatal(err)
	}
	defer move.Close()
	if n, err := move.MigrateKeys(ctx, 1000); err != nil || n == 0 {
		t.Fatalf("migrate the keys of slot %d: %d moved, %v", slot, n, err)
	}

	w, err := clientkit.NewClient(testenv.Pool(t, pgURL), workerDQ, ob, delayq.WorkerConfig{Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		ran = map[string]bool{}
	)
	for i := range queues {
		if err := w.Handle(fmt.Sprintf("q%d", i), func(_ context.Context, task *delayq.Task) error {
			mu.Lock()
			defer mu.Unlock()
			ran[task.Queue] = true
			return nil
		}, delayq.QueueConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	go func() { errs <- w.Run(runCtx) }()
	// While the slot moves, the worker's claims on q0 are redirected (ASK) and
	// refused for now (TRYAGAIN: a script's keys are split between the nodes); the
	// other queues run.
	waitFor(t, 60*time.Second, "the tasks of the other queues", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ran) == queues-1 && !ran["q0"]
	})
	if err := move.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "every task done", func() bool {
		var done int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE state = 'done'`).Scan(&done)
		return done == queues
	})
	for _, n := range cl.Nodes {
		c := redis.NewClient(&redis.Options{Addr: n.Addr()})
		if entries := aclLog(t, c); len(entries) != 0 {
			t.Errorf("node %s refused commands:\n%s", n.Addr(), strings.Join(entries, "\n"))
		}
		c.Close()
	}
}
