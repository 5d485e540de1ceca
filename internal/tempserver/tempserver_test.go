package tempserver

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// TestRedisRestartLosesData checks what fault tests rely on: Kill and Start give an
// empty server on the same address.
func TestRedisRestartLosesData(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := StartRedis(ctx, RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	opt, _ := redis.ParseURL(r.URL())
	c := redis.NewClient(opt)
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r.Kill()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("ping succeeded on a killed server")
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	n, err := c.Exists(ctx, "k").Result()
	if err != nil || n != 0 {
		t.Fatalf("after restart: exists=%d err=%v, want 0 and nil", n, err)
	}
}

// TestPostgresRestartKeepsData checks Stop/Start on the same port and data, and
// database cloning.
func TestPostgresRestartKeepsData(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := StartPostgres(ctx, PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	u, err := CreateDatabase(ctx, pg.URL(), "one", "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "CREATE TABLE x (v int); INSERT INTO x VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	procs := processTree(pg.proc.cmd.Process.Pid)
	if len(procs) < 3 {
		t.Fatalf("server processes %v: want the postmaster and its children", procs)
	}
	pg.Kill()
	// The whole server is gone, not just the postmaster: a backend or background
	// process left behind would keep the old shared memory attached.
	for _, pid := range procs {
		if alive(pid) {
			t.Fatalf("process %d of the killed server still runs", pid)
		}
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	clone, err := CreateDatabase(ctx, pg.URL(), "two", "one")
	if err != nil {
		t.Fatal(err)
	}
	c, err = pgx.Connect(ctx, clone)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var v int
	if err := c.QueryRow(ctx, "SELECT v FROM x").Scan(&v); err != nil || v != 42 {
		t.Fatalf("clone after restart: v=%d err=%v, want 42", v, err)
	}
	if err := DropDatabase(ctx, pg.URL(), "two"); err != nil {
		t.Fatal(err)
	}
}

// TestRedisCluster starts a 3-master cluster and checks that keys of one hash tag
// land on one node and a cluster client reaches them all.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := StartRedisCluster(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer rdb.Close()
	for i := range 30 {
		q := "q" + string(rune('a'+i%26))
		if err := rdb.MSet(ctx, "p:{"+q+"}:a", 1, "p:{"+q+"}:b", 2).Err(); err != nil {
			t.Fatalf("MSET in one slot: %v", err)
		}
	}
	var masters atomic.Int32 // ForEachMaster calls concurrently
	err = rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		masters.Add(1)
		return nil
	})
	if err != nil || masters.Load() != 3 {
		t.Fatalf("masters=%d err=%v, want 3", masters.Load(), err)
	}
}
