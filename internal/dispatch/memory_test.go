package dispatch

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/delayq/delayq/internal/testenv"
)

// TestMemoryPerTask measures Redis memory per task (used_memory delta over 100,000
// tasks with a 20-byte payload, on a server of its own): ready tasks (hash + ZSET
// member) must stay within 250 bytes. It also reports active and done tasks.
func TestMemoryPerTask(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a Redis server with 100,000 tasks")
	}
	t.Parallel()
	const n = 100_000
	srv := testenv.OwnRedis(t)
	rdb := testenv.RedisClient(t, srv.URL())
	c, err := New(rdb, Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	base := usedMemory(t, rdb)
	start := time.Now()
	payload := []byte(strings.Repeat("p", 20))
	runAt := time.Now().Add(-time.Hour) // all due, spread over 100 s
	tasks := make([]Task, 0, 1000)
	for i := 0; i < n; i += 1000 {
		tasks = tasks[:0]
		for j := i; j < i+1000; j++ {
			tasks = append(tasks, Task{ID: fmt.Sprintf("order-%07d", j), Payload: payload, RunAt: runAt.Add(time.Duration(j) * time.Millisecond)})
		}
		if _, err := c.Enqueue(ctx, "payment", tasks...); err != nil {
			t.Fatal(err)
		}
	}
	ready := float64(usedMemory(t, rdb)-base) / n
	t.Logf("ready task (hash + ready ZSET member): %.1f B (enqueue took %v)", ready, time.Since(start))
	// The target is 250 B. A task with default settings is a one-field hash (a
	// 32-byte listpack, Keys.TaskKey) and its ZSET member: about 234 B, runs move
	// by about a byte (skiplist node levels are random).
	if ready > 250 {
		t.Errorf("%.1f B per ready task, target <= 250", ready)
	}

	var claimed []ClaimedTask
	for len(claimed) < n {
		cl, err := c.Claim(ctx, "payment", 1000, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		claimed = append(claimed, cl.Tasks...)
	}
	active := float64(usedMemory(t, rdb)-base) / n
	t.Logf("active task (hash with token + active ZSET member): %.0f B (claims took %v)", active, time.Since(start))
	start = time.Now()

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for _, ct := range claimed {
		g.Go(func() error { return c.Complete(gctx, "payment", ct.ID, ct.Token) })
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	done := float64(usedMemory(t, rdb)-base) / n
	t.Logf("done task kept for the retention (hash with TTL): %.0f B (completes took %v)", done, time.Since(start))
}

func usedMemory(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no used_memory in INFO")
	return 0
}
