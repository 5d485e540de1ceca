package tempserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCluster is a Redis Cluster of local redis-server processes: masters and one
// replica each, created with redis-cli --cluster create.
type RedisCluster struct {
	Nodes []*Redis // masters first, then their replicas, as created
	dir   string
}

// StartRedisCluster starts masters×2 nodes (one replica per master) and joins them
// into a cluster. It needs local redis-server and redis-cli binaries.
func StartRedisCluster(ctx context.Context, masters int) (*RedisCluster, error) {
	if masters < 3 {
		return nil, fmt.Errorf("tempserver: a cluster needs at least 3 masters, got %d", masters)
	}
	bin, err := RedisBinary("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%w: Redis Cluster needs local redis-server: %s", ErrNoServer, InstallBinaries)
	}
	cli, err := RedisBinary("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("%w: Redis Cluster needs local redis-cli: %s", ErrNoServer, InstallBinaries)
	}
	dir, err := os.MkdirTemp("", "delayq-cluster-")
	if err != nil {
		return nil, err
	}
	c := &RedisCluster{dir: dir}
	addrs := make([]string, 0, 2*masters)
	for i := range 2 * masters {
		nodeDir := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(nodeDir, 0o755); err != nil {
			c.Close()
			return nil, err
		}
		n, err := startClusterNode(ctx, bin, nodeDir)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
		addrs = append(addrs, n.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	if err := c.waitHealthy(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// startClusterNode starts one cluster node in dir. A node listens on two ports,
// its own and the cluster bus's (its own + 10000, the only choice Redis 6 has),
// and freePort vouches for the first only: an outgoing connection or another
// server may hold the second. So the port is chosen with its bus port free, and
// a node that still loses the race to bind is started again on other ports.
func startClusterNode(ctx context.Context, bin, dir string) (*Redis, error) {
	var err error
	for range 5 {
		var port int
		if port, err = freeClusterPort(); err != nil {
			return nil, err
		}
		n := &Redis{bin: bin, dir: dir, port: port, args: []string{
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no"}}
		if err = n.Start(ctx); err == nil {
			return n, nil
		}
		if !strings.Contains(err.Error(), "Address already in use") {
			return nil, err
		}
		os.Remove(filepath.Join(dir, "nodes.conf"))
		os.Remove(filepath.Join(dir, "redis.log"))
	}
	return nil, err
}

// clusterBusOffset is how far above a node's port Redis puts its cluster bus.
const clusterBusOffset = 10000

// freeClusterPort returns a free port whose cluster bus port is free as well.
func freeClusterPort() (int, error) {
	for range 100 {
		port, err := freePort()
		if err != nil {
			return 0, err
		}
		if port+clusterBusOffset > 65535 {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+clusterBusOffset))
		if err != nil {
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, errors.New("tempserver: no free port with a free cluster bus port")
}

// Addrs lists every node's host:port.
func (c *RedisCluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr()
	}
	return out
}

// waitHealthy waits until every node reports cluster_state:ok.
func (c *RedisCluster) waitHealthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for _, n := range c.Nodes {
		opt, _ := redis.ParseURL(n.URL())
		rdb := redis.NewClient(opt)
		for {
			info, err := rdb.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			select {
			case <-ctx.Done():
				rdb.Close()
				return fmt.Errorf("cluster not healthy: %w (last: %v)", ctx.Err(), err)
			case <-time.After(50 * time.Millisecond):
			}
		}
		rdb.Close()
	}
	return nil
}

// Close stops every node and removes the directory.
func (c *RedisCluster) Close() {
	for _, n := range c.Nodes {
		n.Close()
	}
	_ = os.RemoveAll(c.dir)
}
