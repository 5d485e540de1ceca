package relay_test

import (
	"fmt"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// redisCopy is what Redis holds of one task: its hash (HGETALL), the hash
// serialized (DUMP: the same fields in the same order), and its scores in the
// ready ZSET and the priority index.
type redisCopy struct {
	hash         map[string]string
	dump         string
	ready, index float64
}

func (b testBundle) redisCopy(t *testing.T, queue, id string) redisCopy {
	t.Helper()
	ctx := ctxT(t)
	k, err := b.dq.Keys(queue)
	if err != nil {
		t.Fatal(err)
	}
	var c redisCopy
	if c.hash, err = b.rdb.HGetAll(ctx, k.TaskKey(id)).Result(); err != nil {
		t.Fatal(err)
	}
	if c.dump, err = b.rdb.Dump(ctx, k.TaskKey(id)).Result(); err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	c.ready, _ = b.rdb.ZScore(ctx, k.Ready, id).Result()
	c.index, _ = b.rdb.ZScore(ctx, k.Priority, id).Result()
	return c
}

// Every path that writes a task into Redis from its outbox row writes the same
// task: the relay's round, reconcile's restore, the self-healing's repair after a
// loss, and a retry from dead that the relay then moves. One task with every
// field a row can hand Redis (a binary payload, attempts used, a version past 1,
// max attempts, a trace context, a start deadline, a priority, a concurrency key)
// goes through each,
// and its hash is compared byte for byte with the round's, as is its place in the
// ready ZSET and the priority index. Before there was one encoder (RedisRow.Task
// and write_task), restores dropped the trace context (field c).
func TestEveryPathWritesTheSameTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	const q, id = "enc", "t1"
	due := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	startBy := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	payload := []byte("{\"n\":1}\x00\xff binary")
	trace := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 vendor=opaque"
	b.enqueue(t, outbox.Task{Queue: q, ID: id, Payload: payload, RunAt: due, StartBy: startBy,
		MaxAttempts: 5, TraceContext: trace, Priority: 7, ConcurrencyKey: "tenant-9"})
	// Two recorded failures and two reschedules, as a row would have them.
	if _, err := b.pool.Exec(ctx, `UPDATE delayq_outbox SET attempt = 2, version = 3 WHERE queue = $1 AND task_id = $2`, q, id); err != nil {
		t.Fatal(err)
	}
	// What the relay's round must write, spelled out: the payload and the fields
	// not at their defaults (delayq.Keys.TaskKey), the due time as the ready score,
	// and the priority index's score (9 - priority) * 10^13 + due ms.
	want := map[string]string{"p": string(payload), "a": "2", "v": "3", "m": "5", "c": trace,
		"d": strconv.FormatInt(startBy.UnixMilli(), 10), "y": "7", "k": "tenant-9"}
	indexScore := func(runAt time.Time) float64 { return float64(2e13 + runAt.UnixMilli()) }
	k, err := b.dq.Keys(q)
	if err != nil {
		t.Fatal(err)
	}

	// The relay's round: the reference.
	rl, err := relay.New(testenv.Pool(t, b.url), b.dq.AsRedis(), relay.Config{RepairRate: -1, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := rl.Round(ctx); err != nil || n != 1 {
		t.Fatalf("round: %d rows, %v", n, err)
	}
	ref := b.redisCopy(t, q, id)
	if !maps.Equal(ref.hash, want) || ref.ready != float64(due.UnixMilli())/1000 || ref.index != indexScore(due) {
		t.Fatalf("relay round wrote %q (ready %v, index %v)\nwant %q (ready %v, index %v)",
			ref.hash, ref.ready, ref.index, want, float64(due.UnixMilli())/1000, indexScore(due))
	}

	same := func(path string, got redisCopy) {
		t.Helper()
		if !maps.Equal(got.hash, ref.hash) {
			t.Errorf("%s wrote %q\nthe relay's round %q", path, got.hash, ref.hash)
		}
		if got.dump != ref.dump {
			t.Errorf("%s: the hash serializes otherwise than the relay round's (fields in another order?)", path)
		}
		if got.ready != ref.ready || got.index != ref.index {
			t.Errorf("%s: ready score %v, index score %v; the relay round's %v, %v", path, got.ready, got.index, ref.ready, ref.index)
		}
	}

	// Reconcile's restore of a task Redis lost alone.
	if err := b.rdb.Del(ctx, k.TaskKey(id)).Err(); err != nil {
		t.Fatal(err)
	}
	b.rdb.ZRem(ctx, k.Ready, id)
	b.rdb.ZRem(ctx, k.Priority, id)
	rep, err := reconcile.Reconcile(ctx, b.pool, b.dq, reconcile.Options{Queues: []string{q}})
	if err != nil || rep.Kinds[reconcile.MissingInRedis].Repaired != 1 {
		t.Fatalf("reconcile: %+v, %v", rep, err)
	}
	same("reconcile's restore", b.redisCopy(t, q, id))

	// The self-healing's repair after Redis lost every key of the prefix (its epoch
	// mark included) under a relay that leads.
	running := b.start(t, healConfig())
	eventually(t, 10*time.Second, func() (bool, string) {
		age := running.metric(t, "delayq_relay_repair_pass_age_seconds")
		return age > 0, fmt.Sprintf("no healing pass completed (pass age %v)", age)
	})
	keys, err := b.rdb.Keys(ctx, b.prefix+":*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys of the prefix: %v, %v", keys, err)
	}
	if err := b.rdb.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() (bool, string) {
		ti := b.info(t, q, id)
		return ti.State == dispatch.StateReady, "after the loss, in Redis: " + string(ti.State)
	})
	if n := running.metric(t, "delayq_relay_redis_losses_total"); n != 1 {
		t.Errorf("losses counted %v, want 1", n)
	}
	same("the self-healing's repair", b.redisCopy(t, q, id))

	// A retry from dead, which the relay moves: the dead copy in Redis (killed
	// with its error) is replaced by the new version. The retry is the version
	// after, with no attempt used, due at the retry: those fields differ by the
	// transition, not by the encoding. A replaced hash also states the ready status
	// (s = r) that a new hash leaves out as its default.
	if _, err := b.pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'dead', done_at = now(), last_error = 'boom' WHERE queue = $1 AND task_id = $2`, q, id); err != nil {
		t.Fatal(err)
	}
	_, probes, err := b.dq.Probe(ctx, q, id)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := b.dq.RepairIf(ctx, q, dispatch.Repair{Op: dispatch.RepairKill, ID: id, Fingerprint: probes[0].Fingerprint, Error: "boom"}); err != nil || !ok[0] {
		t.Fatalf("kill in Redis: %v %v", ok, err)
	}
	if err := reconcile.RetryDead(ctx, b.pool, reconcile.Options{}, q, id); err != nil {
		t.Fatal(err)
	}
	var runAt time.Time
	eventually(t, 10*time.Second, func() (bool, string) {
		var st string
		if err := b.pool.QueryRow(ctx, `SELECT state, run_at FROM delayq_outbox WHERE queue = $1 AND task_id = $2`, q, id).Scan(&st, &runAt); err != nil {
			t.Fatal(err)
		}
		ti := b.info(t, q, id)
		return st == "queued" && ti.Version == 4, fmt.Sprintf("row %s, Redis %+v", st, ti)
	})
	got := b.redisCopy(t, q, id)
	if got.hash["s"] == "r" {
		delete(got.hash, "s")
	}
	retried := maps.Clone(ref.hash)
	retried["v"] = "4"
	delete(retried, "a")
	due = ceilMilli(runAt) // formatScore rounds up: never early
	if !maps.Equal(got.hash, retried) {
		t.Errorf("dead retry, then the relay, wrote %q\nwant %q (the round's, at version 4 with no attempt)", got.hash, retried)
	}
	if got.ready != float64(due.UnixMilli())/1000 || got.index != indexScore(due) {
		t.Errorf("dead retry: ready score %v, index score %v; want %v, %v", got.ready, got.index, float64(due.UnixMilli())/1000, indexScore(due))
	}
}
