package testenv

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/tempserver"
)

// ClusterMasters is the number of masters of a test cluster; each has one replica.
const ClusterMasters = 3

// RedisCluster starts a Redis Cluster only this test (and its subtests) uses, from
// local redis-server and redis-cli binaries: ClusterMasters masters with one
// replica each, every replica in sync. It returns a cluster client and the cluster, so that the test can
// fail a master over (tempserver.RedisCluster.KillMaster, Failover). Both are closed
// when the test ends. Starting takes a few seconds (redis-cli --cluster create);
// subtests share one cluster with ClusterPrefix. A missing binary fails the test.
//
// The client is configured as a delayq deployment on a cluster should be (see
// ClusterOptions).
func RedisCluster(t testing.TB) (*redis.ClusterClient, *tempserver.RedisCluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := tempserver.StartRedisCluster(ctx, ClusterMasters)
	if err != nil {
		t.Fatalf("testenv: Redis Cluster: %v", err)
	}
	t.Cleanup(c.Close)
	if err := c.WaitReplicas(ctx); err != nil {
		t.Fatalf("testenv: Redis Cluster: %v", err)
	}
	t.Logf("testenv: Redis Cluster of %d nodes up in %v", len(c.Nodes), time.Since(start).Round(time.Millisecond))
	return ClusterClient(t, c), c
}

// ClusterOptions are the client options the tests use on a cluster of addrs.
//
// ClusterStateReloadInterval is short on purpose: go-redis learns a new slot
// layout from a MOVED reply or from this periodic reload (default 60s). After a
// master dies, nothing answers for its slots with MOVED — its address refuses
// connections — so without a short reload the client keeps dialing the dead
// master until the next periodic reload.
func ClusterOptions(addrs []string) *redis.ClusterOptions {
	return &redis.ClusterOptions{
		Addrs:                      addrs,
		ClusterStateReloadInterval: time.Second,
		DialTimeout:                time.Second,
		ReadTimeout:                3 * time.Second,
		WriteTimeout:               3 * time.Second,
	}
}

// ClusterClient opens a client on cluster c (ClusterOptions), closed when the test
// ends.
func ClusterClient(t testing.TB, c *tempserver.RedisCluster) *redis.ClusterClient {
	t.Helper()
	rdb := redis.NewClusterClient(ClusterOptions(c.Addrs()))
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// ClusterPrefix returns a key prefix only this test uses on a cluster shared with
// other tests (subtests of the test that started it). Its keys are deleted from
// every master when the test ends.
func ClusterPrefix(t testing.TB, rdb *redis.ClusterClient) string {
	t.Helper()
	prefix := fmt.Sprintf("t%d.%d", os.Getpid(), shared.seq.Add(1))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := rdb.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			deletePrefix(n, prefix)
			return nil
		})
		if err != nil {
			t.Logf("testenv: delete cluster prefix %s: %v", prefix, err)
		}
	})
	return prefix
}
