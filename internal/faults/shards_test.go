package faults

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/relay"
)

// Redis, without persistence, killed and started again (empty) while the relay is
// down, with queues of 3 shards and the load running: the tasks committed during
// the outage wait in the outbox, and the relay started again (a process of its
// own: its Client finds no shard count in Redis) moves them by the count Postgres
// holds, and its self-healing restores what Redis lost by that count too. A worker
// that held the count through the loss and one started after it (which finds the
// count only once it is mirrored back) run every task once in effect, and no task
// is ever claimed from a shard other than its own (issue 29, defect 1: the relay's
// first round put every task into shard 0).
func TestRedisLossRelayDownSharded(t *testing.T) {
	t.Parallel()
	const shards = 3
	own := testenv.OwnRedis(t)
	s := newSystem(t, "redis-loss-relay-down-sharded", testenv.PostgresURL(t), own.URL())
	ctx := s.ctx()
	s.shardQueues(ctx, shards)
	pl := newPlacement(t, s, shards)
	stopRelay := s.startRelay("relay-1")
	s.runWorker("worker-a", pl)
	l := s.newLoad(loadTasks, loadTime)
	done := l.start(ctx)

	s.waitEffects(ctx, 50)
	pause(ctx, between(500*time.Millisecond, 1500*time.Millisecond))
	stopRelay()
	own.Kill()
	pause(ctx, between(200*time.Millisecond, 500*time.Millisecond))
	if err := own.Start(ctx); err != nil {
		t.Fatalf("start Redis again: %v", err)
	}
	// Tasks committed while the relay is down and Redis holds nothing.
	pause(ctx, between(time.Second, 2*time.Second))
	var waiting int
	if err := s.admin.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE state = 'pending'`).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	s.startRelay("relay-2")
	s.runWorker("worker-b", pl)

	wait(ctx, done)
	s.check(ctx, l, checkOpts{faults: 1, redisLost: true})
	if waiting == 0 {
		t.Errorf("no task was pending when the relay started again: the outage never bit")
	}
	claimed, misplaced := pl.claimed.Load(), pl.misplaced.Load()
	t.Logf("claims checked for placement: %d tasks, %d from a shard not their own", claimed, misplaced)
	if claimed == 0 {
		t.Errorf("no claim was checked for placement")
	}
	if misplaced > 0 {
		pl.mu.Lock()
		t.Errorf("%d tasks claimed from a shard not their own, e.g. %s", misplaced, strings.Join(pl.samples, "; "))
		pl.mu.Unlock()
	}
}

// startRelay runs a relay in this process, on a Client of its own as a process
// started anew has, until stop or the end of the test.
func (s *system) startRelay(name string) (stop func()) {
	t := s.t
	pool := testenv.Pool(t, withParam(t, s.pgURL, "pool_max_conns", "4"))
	r, err := relay.New(pool, s.delayqClient(t, s.redisURL).AsRedis(), relayConfig(s.logger(name)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.Run(ctx); err != nil {
			t.Errorf("%s: Run: %v", name, err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// placement is a hook on the workers' Redis clients that reads every claim's
// reply: a task claimed from shard k of a queue of n shards must have
// ShardOf(id, n) = k. Any other is a copy in a shard not its own, which cancel and
// reschedule never reach.
type placement struct {
	n                  int
	shardOf            map[string]int // a shard's ready key → its index
	claimed, misplaced atomic.Int64
	mu                 sync.Mutex
	samples            []string
}

func newPlacement(t *testing.T, s *system, n int) *placement {
	p := &placement{n: n, shardOf: map[string]int{}}
	for _, q := range s.queues {
		for k := range n {
			keys, err := dispatch.ShardKeys(s.prefix, q, k, n)
			if err != nil {
				t.Fatal(err)
			}
			p.shardOf[keys.Ready] = k
		}
	}
	return p
}

func (p *placement) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *placement) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		p.check(cmd)
		return err
	}
}

func (p *placement) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			p.check(cmd)
		}
		return err
	}
}

// check reads cmd if it is a claim (its keys: ready, active, task prefix, ctl,
// history, priority index; lua/claim.lua) that succeeded.
func (p *placement) check(cmd redis.Cmder) {
	c, ok := cmd.(*redis.Cmd)
	if !ok || c.Err() != nil {
		return
	}
	a := c.Args()
	if len(a) < 9 {
		return
	}
	if name, _ := a[0].(string); name != "evalsha" && name != "eval" {
		return
	}
	ready, _ := a[3].(string)
	ctl, _ := a[6].(string)
	hist, _ := a[7].(string)
	k, ok := p.shardOf[ready]
	if !ok || !strings.HasSuffix(ctl, ":ctl") || !strings.HasSuffix(hist, ":h:") {
		return
	}
	v, ok := c.Val().([]any)
	if !ok || len(v) < 5 {
		return
	}
	// The reply's head, then 9 fields a task, the id first.
	count, _ := v[3].(int64)
	head := len(v) - 9*int(count)
	if head < 5 {
		return
	}
	for i := range int(count) {
		id, _ := v[head+9*i].(string)
		p.claimed.Add(1)
		if want := dispatch.ShardOf(id, p.n); want != k {
			p.misplaced.Add(1)
			p.mu.Lock()
			if len(p.samples) < 5 {
				p.samples = append(p.samples, fmt.Sprintf("%s from shard %d, its own %d (%s)", id, k, want, ready))
			}
			p.mu.Unlock()
		}
	}
}
