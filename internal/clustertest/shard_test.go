package clustertest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/tempserver"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// TestShardedQueue splits one queue into 3 and into 5 shards (delayq.Controls.Shards)
// on the 3-master cluster and runs it end to end: producers enqueue through the
// outbox, the relay moves the rows (each task's hash on the master owning its
// shard's slot, every master holding some, the queue's stats the sum of its
// shards), two workers drain it with plain and with transactional handlers (each
// task run to success once, failures retried, tasks out of attempts dead in their
// shard), and a dead task retried from Postgres runs again. Claims alone: every
// shard served from the first claims of a backlog, due-time order kept within
// each shard.
func TestShardedQueue(t *testing.T) {
	t.Parallel()
	rdb, cl := testenv.RedisCluster(t)
	for _, shards := range []int{3, 5} {
		t.Run(fmt.Sprintf("Claims%d", shards), func(t *testing.T) { t.Parallel(); testShardClaims(t, rdb, cl, shards) })
		for _, tx := range []bool{false, true} {
			name := fmt.Sprintf("Plain%d", shards)
			if tx {
				name = fmt.Sprintf("Tx%d", shards)
			}
			t.Run(name, func(t *testing.T) { t.Parallel(); testShardedEndToEnd(t, rdb, cl, shards, tx) })
		}
	}
}

// shardQueue is the sharded queue of these tests.
const shardQueue = "hot"

// setShards splits queue into n shards, before any of its tasks exists, with the
// control operation: in Postgres first (the truth the relay mirrors; a database
// of its own when pg is nil), then in Redis.
func setShards(t testing.TB, pg *pgBundle, dq *dispatch.Client, queue string, n int) {
	t.Helper()
	ctx := context.Background()
	if pg == nil {
		b := newPG(t)
		pg = &b
	}
	ctl, err := queuectl.New(pg.pool, dq, pg.ob.Config().Schema)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.SetShards(ctx, queue, n); err != nil {
		t.Fatal(err)
	}
	if c, _, err := dq.Controls(ctx, queue); err != nil || c.Shards != n {
		t.Fatalf("controls of %s: %+v, %v; want %d shards", queue, c, err, n)
	}
}

// shardLayout is where each shard of a queue lives.
type shardLayout struct {
	keys   []dispatch.Keys
	master []*redis.Client // a client on the master serving shard k
	addr   []string
}

// layoutOf finds each shard's keys and master; it fails the test unless the
// shards use every master (or as many as there are shards).
func layoutOf(t testing.TB, cl *tempserver.RedisCluster, prefix, queue string, shards int) shardLayout {
	t.Helper()
	ctx := context.Background()
	var l shardLayout
	clients := map[string]*redis.Client{}
	for k := range shards {
		ks, err := dispatch.ShardKeys(prefix, queue, k, shards)
		if err != nil {
			t.Fatal(err)
		}
		m, err := cl.MasterFor(ctx, ks.Ready)
		if err != nil {
			t.Fatal(err)
		}
		c, ok := clients[m.Addr()]
		if !ok {
			c = redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { _ = c.Close() })
			clients[m.Addr()] = c
		}
		l.keys, l.master, l.addr = append(l.keys, ks), append(l.master, c), append(l.addr, m.Addr())
	}
	if want := min(shards, masterCount(t, cl)); len(clients) != want {
		t.Fatalf("%d shards on %d masters (%v), want %d", shards, len(clients), l.addr, want)
	}
	return l
}

// masterCount counts the masters serving slots.
func masterCount(t testing.TB, cl *tempserver.RedisCluster) int {
	t.Helper()
	ms, err := cl.Masters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(ms)
}

// testShardClaims: a backlog in every shard (due times in the past, distinct):
// the first claims take from every shard, not one shard after the other, and
// within a shard tasks are claimed in due-time order.
func testShardClaims(t *testing.T, rdb *redis.ClusterClient, cl *tempserver.RedisCluster, shards int) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix := testenv.ClusterPrefix(t, rdb)
	dq := newDQ(t, rdb, prefix, 2*time.Second)
	setShards(t, nil, dq, shardQueue, shards)
	layoutOf(t, cl, prefix, shardQueue, shards)

	const n = 400
	base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	var tasks []dispatch.Task
	perShard := make([]int64, shards)
	for i := range n {
		// Due times in the reverse of the ids' order, so that an order by id or by
		// insertion cannot pass for an order by due time.
		id := fmt.Sprintf("c%03d", i)
		tasks = append(tasks, dispatch.Task{ID: id, RunAt: base.Add(time.Duration(n-i) * time.Millisecond)})
		perShard[dispatch.ShardOf(id, shards)]++
	}
	st, err := dq.Enqueue(ctx, shardQueue, tasks...)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range st {
		if s != dispatch.Added {
			t.Fatalf("%s: %v", tasks[i].ID, s)
		}
	}
	if s, err := dq.Stats(ctx, shardQueue); err != nil || s.Ready != n || s.DueNow != n {
		t.Fatalf("stats %+v, %v: want %d ready, due now", s, err, n)
	}

	const batch = 10
	last := make([]time.Time, shards)
	from := make([]int64, shards)
	claimed := 0
	for call := 0; claimed < n; call++ {
		c, err := dq.Claim(ctx, shardQueue, batch, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Tasks) == 0 {
			t.Fatalf("claim %d: nothing with %d of %d tasks claimed", call, claimed, n)
		}
		for _, ct := range c.Tasks {
			k := dispatch.ShardOf(ct.ID, shards)
			if ct.Due.Before(last[k]) {
				t.Errorf("shard %d: %s due %v claimed after a task due %v", k, ct.ID, ct.Due, last[k])
			}
			last[k] = ct.Due
			from[k]++
			if err := dq.Complete(ctx, shardQueue, ct.ID, ct.Token); err != nil {
				t.Fatal(err)
			}
		}
		claimed += len(c.Tasks)
		// Fair: after claims of as many tasks as two per shard and batch, every
		// shard has given some.
		if claimed >= 2*shards*batch && slices.Contains(from, 0) {
			t.Fatalf("after %d claims (%d tasks) the shards gave %v: one not served", call+1, claimed, from)
		}
	}
	if !slices.Equal(from, perShard) {
		t.Errorf("tasks claimed per shard %v, enqueued %v", from, perShard)
	}
	if s, err := dq.Stats(ctx, shardQueue); err != nil || s.Ready != 0 || s.Active != 0 {
		t.Errorf("stats after: %+v, %v", s, err)
	}
}

// testShardedEndToEnd: outbox, relay, two workers on a queue of shards shards.
func testShardedEndToEnd(t *testing.T, rdb *redis.ClusterClient, cl *tempserver.RedisCluster, shards int, tx bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	pg := newPG(t)
	prefix := testenv.ClusterPrefix(t, rdb)
	// A long MaxWait: the dead task's new life arrives while the workers sleep, so
	// it runs in time only if its shard's enqueue wakes them.
	dq := newDQ(t, rdb, prefix, time.Minute)
	setShards(t, &pg, dq, shardQueue, shards)
	lay := layoutOf(t, cl, prefix, shardQueue, shards)

	const n = 600
	failFirst := func(i int) bool { return i%10 == 3 }
	alwaysFail := func(i int) bool { return i%50 == 7 }
	var tasks []outbox.Task
	index := map[string]int{}
	perShard := make([]int64, shards)
	var dead []string
	for i := range n {
		tk := outbox.Task{Queue: shardQueue, ID: fmt.Sprintf("e%04d", i), Payload: []byte{byte(i % 256), byte(i / 256)}}
		if alwaysFail(i) {
			tk.MaxAttempts = 1
			dead = append(dead, tk.ID)
		}
		tasks = append(tasks, tk)
		index[tk.ID] = i
		perShard[dispatch.ShardOf(tk.ID, shards)]++
	}
	pg.produce(t, tasks, 100)
	runRelay(t, pg.url, dq, relay.Config{PollInterval: time.Second, ReapInterval: 200 * time.Millisecond,
		StatsInterval: -1, Retention: -1, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	eventually(t, 60*time.Second, func() (bool, string) {
		s := pg.states(t)
		return s["queued"] == n, fmt.Sprint(s)
	})

	// Placement: each task's hash on the master of its shard, each shard's ready
	// set as large as ShardOf says, the queue's stats their sum.
	hashes := map[string]int{}
	for _, tk := range tasks {
		k := dispatch.ShardOf(tk.ID, shards)
		ok, err := lay.master[k].Exists(ctx, lay.keys[k].TaskKey(tk.ID)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ok != 1 {
			t.Errorf("%s (shard %d): no hash %s on %s", tk.ID, k, lay.keys[k].TaskKey(tk.ID), lay.addr[k])
			continue
		}
		hashes[lay.addr[k]]++
	}
	if want := min(shards, masterCount(t, cl)); len(hashes) != want {
		t.Errorf("tasks on %d masters (%v), want %d", len(hashes), hashes, want)
	}
	var sum int64
	for k := range shards {
		c, err := lay.master[k].ZCard(ctx, lay.keys[k].Ready).Result()
		if err != nil {
			t.Fatal(err)
		}
		if c != perShard[k] {
			t.Errorf("shard %d holds %d ready tasks, want %d", k, c, perShard[k])
		}
		sum += c
	}
	if s, err := dq.Stats(ctx, shardQueue); err != nil || s.Ready != sum || s.Ready != n || s.Active != 0 || s.Dead != 0 {
		t.Errorf("stats %+v, %v: want the shards' sum, %d ready", s, err, n)
	}
	t.Logf("%d shards: %d tasks per shard %v, hashes per master %v", shards, n, perShard, hashes)

	// The drain: failures retried, tasks out of attempts dead.
	var (
		mu      sync.Mutex
		ok      = map[string]int{} // successful runs (plain handlers)
		revived = map[string]bool{}
	)
	fail := func(tk *delayq.Task) error {
		i := index[tk.ID]
		mu.Lock()
		defer mu.Unlock()
		if (alwaysFail(i) && !revived[tk.ID]) || (failFirst(i) && tk.Attempt == 1) {
			return errInjected
		}
		return nil
	}
	var workers []*delayq.Client
	for _, name := range []string{"w1", "w2"} {
		w, err := clientkit.NewClient(pg.workerPool(t), dq, pg.ob, delayq.WorkerConfig{
			ErrorPause: 100 * time.Millisecond, ShutdownTimeout: 5 * time.Second, Logger: testLogger(t, name)})
		if err != nil {
			t.Fatal(err)
		}
		qc := delayq.QueueConfig{Concurrency: 8, Backoff: delayq.Backoff{Base: 50 * time.Millisecond, Max: 100 * time.Millisecond}}
		if tx {
			err = w.HandleTx(shardQueue, func(ctx context.Context, tx pgx.Tx, tk *delayq.Task) error {
				if err := effect(ctx, tx, name, tk); err != nil {
					return err
				}
				return fail(tk) // a failure rolls the effect back
			}, qc)
		} else {
			err = w.Handle(shardQueue, func(_ context.Context, tk *delayq.Task) error {
				if err := fail(tk); err != nil {
					return err
				}
				mu.Lock()
				ok[tk.ID]++
				mu.Unlock()
				return nil
			}, qc)
		}
		if err != nil {
			t.Fatal(err)
		}
		background(t, name, w.Run)
		workers = append(workers, w)
	}
	nDead := len(dead)
	eventually(t, 60*time.Second, func() (bool, string) {
		s := pg.states(t)
		return s["done"] == n-nDead && s["dead"] == nDead, fmt.Sprint(s)
	})
	eventually(t, 5*time.Second, func() (bool, string) {
		s, err := dq.Stats(ctx, shardQueue)
		return err == nil && s.Ready == 0 && s.Active == 0 && s.Dead == int64(nDead),
			fmt.Sprintf("stats %+v, %v: want %d dead, nothing ready or active", s, err, nDead)
	})
	for _, id := range dead {
		k := dispatch.ShardOf(id, shards)
		if _, err := lay.master[k].ZScore(ctx, lay.keys[k].Dead, id).Result(); err != nil {
			t.Errorf("dead %s not in its shard's dead set (shard %d): %v", id, k, err)
		}
	}
	checkRuns := func() {
		t.Helper()
		if tx {
			pg.checkEffects(t)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, tk := range tasks {
			want := 1
			if alwaysFail(index[tk.ID]) && !revived[tk.ID] {
				want = 0
			}
			if ok[tk.ID] != want {
				t.Errorf("%s succeeded %d times, want %d", tk.ID, ok[tk.ID], want)
			}
		}
	}
	checkRuns()

	// A dead task retried: its row pending again, the relay moves the new version
	// into its shard (replacing the dead record), a worker runs it.
	again := dead[0]
	mu.Lock()
	revived[again] = true
	mu.Unlock()
	if err := reconcile.RetryDead(ctx, pg.pool, reconcile.Options{}, shardQueue, again); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		s := pg.states(t)
		return s["done"] == n-nDead+1 && s["dead"] == nDead-1, fmt.Sprint(s)
	})
	eventually(t, 5*time.Second, func() (bool, string) {
		s, err := dq.Stats(ctx, shardQueue)
		return err == nil && s.Ready == 0 && s.Active == 0 && s.Dead == int64(nDead-1),
			fmt.Sprintf("stats %+v, %v: want %d dead, nothing ready or active", s, err, nDead-1)
	})
	k := dispatch.ShardOf(again, shards)
	if err := lay.master[k].ZScore(ctx, lay.keys[k].Dead, again).Err(); err != redis.Nil {
		t.Errorf("retried %s still in its shard's dead set: %v", again, err)
	}
	checkRuns()

	var st [2]delayq.RunStats
	for i, w := range workers {
		st[i] = w.RunStats()
	}
	if st[0].Claimed == 0 || st[1].Claimed == 0 {
		t.Errorf("a worker claimed nothing: %+v / %+v", st[0], st[1])
	}
	t.Logf("workers: %+v / %+v", st[0], st[1])
}
