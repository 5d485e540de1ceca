package dispatch

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type testBundle struct {
	rdb    *redis.Client
	c      *Client
	prefix string
	queue  string
	k      Keys
}

// setup gives a test a client on the shared Redis under a prefix of its own.
func setup(t *testing.T, cfg Config) testBundle {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	cfg.Prefix = prefix
	c, err := New(rdb, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	k, err := c.Keys("q")
	if err != nil {
		t.Fatal(err)
	}
	return testBundle{rdb: rdb, c: c, prefix: prefix, queue: "q", k: k}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// redisNow is the Redis clock in whole milliseconds, as the scripts read it: a
// finer "now" can lie ahead of a script's now within the same millisecond, and a
// due time rounded up from it past Redis's clock.
func redisNow(t *testing.T, rdb redis.UniversalClient) time.Time {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now.Truncate(time.Millisecond)
}

// snapshot returns every key under the bundle's prefix with its serialized value,
// so a test can prove that a call wrote nothing.
func (b testBundle) snapshot(t *testing.T) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := b.rdb.Keys(ctx, b.prefix+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		v, err := b.rdb.Dump(ctx, k).Result()
		if err != nil {
			t.Fatalf("DUMP %s: %v", k, err)
		}
		out[k] = v
	}
	return out
}

// withoutHistory drops the queue's history hashes (counts of claims and
// completions, not tasks) from a snapshot.
func (b testBundle) withoutHistory(snap map[string]string) map[string]string {
	for k := range snap {
		if strings.HasPrefix(k, b.k.History) {
			delete(snap, k)
		}
	}
	return snap
}

func sameSnapshot(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	if len(before) != len(after) {
		t.Errorf("%s: %d keys before, %d after", what, len(before), len(after))
	}
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s: key %s changed", what, k)
		}
	}
}

func (b testBundle) enqueue(t *testing.T, tasks ...Task) []EnqueueStatus {
	t.Helper()
	st, err := b.c.Enqueue(ctxT(t), b.queue, tasks...)
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	return st
}

func (b testBundle) claim(t *testing.T, n int, lease time.Duration) Claim {
	t.Helper()
	cl, err := b.c.Claim(ctxT(t), b.queue, n, lease)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	return cl
}

func (b testBundle) info(t *testing.T, id string) TaskInfo {
	t.Helper()
	ti, err := b.c.Inspect(ctxT(t), b.queue, id)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return ti[0]
}

func ids(ts []ClaimedTask) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.ID
	}
	sort.Strings(out)
	return out
}

func redisZ(member string, score float64) redis.Z { return redis.Z{Member: member, Score: score} }

func setupRedisOnly(t *testing.T) (*redis.Client, string) { return testenv.Redis(t) }
