package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
)

// TestClusterURL: a REDIS_URL naming several nodes (addr parameters) makes the
// commands talk to a Redis Cluster: enqueue, reconcile (which moves the task to
// the cluster, as the relay would after a loss) and stats.
func TestClusterURL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster: make test runs it, as it runs internal/clustertest")
	}
	t.Parallel()
	rdb, cluster := testenv.RedisCluster(t)
	prefix := testenv.ClusterPrefix(t, rdb)
	addrs := cluster.Addrs()
	redisURL := "redis://" + addrs[0] + "?addr=" + addrs[1] + "&addr=" + addrs[2]
	env := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "REDIS_URL": redisURL}
	run := func(args ...string) string {
		t.Helper()
		var out, errOut lockedBuffer
		if code := NewMain(&out, &errOut, func(k string) string { return env[k] }).Run(context.Background(), args); code != 0 {
			t.Fatalf("delayq %s: exit %d: %s", strings.Join(args, " "), code, errOut.String())
		}
		return out.String()
	}
	for _, q := range []string{"alpha", "beta", "gamma", "delta"} {
		run("enqueue", "--queue", q, "--id", "t1", "--delay", "1h")
	}
	// The rows are pending; mark them queued as a relay would have, so reconcile
	// finds them missing in Redis and puts them on the cluster.
	pool := testenv.Pool(t, env["DATABASE_URL"])
	if _, err := pool.Exec(context.Background(), `UPDATE delayq_outbox SET state = 'queued', queued_at = now()`); err != nil {
		t.Fatal(err)
	}
	run("reconcile", "--prefix", prefix)
	out := run("stats", "--prefix", prefix, "--json")
	if strings.Count(out, `"redis_ready": 1,`) != 4 {
		t.Fatalf("stats on the cluster: want 4 queues with one ready task each:\n%s", out)
	}
	// The worker registry: a process's beat, listed, then its goodbye.
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dq.BeatWorker(context.Background(), delayqtype.Worker{ID: "c1", Host: "node-a", Queues: map[string]int{"alpha": 1}}, time.Minute, time.Minute); err != nil {
		t.Fatalf("worker beat on the cluster: %v", err)
	}
	if out := run("workers", "--prefix", prefix); !strings.Contains(out, "node-a") {
		t.Fatalf("workers on the cluster:\n%s", out)
	}
	if err := dq.ByeWorker(context.Background(), "c1"); err != nil {
		t.Fatal(err)
	}
	if out := run("workers", "--prefix", prefix); !strings.Contains(out, "no workers") {
		t.Fatalf("workers on the cluster after the goodbye:\n%s", out)
	}
}
