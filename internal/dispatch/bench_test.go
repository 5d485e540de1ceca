package dispatch

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
)

func benchClient(b *testing.B) *Client {
	b.Helper()
	rdb, prefix := testenv.Redis(b)
	c, err := New(rdb, Config{Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkEnqueue measures the batch enqueue script: 100 tasks per call, as the
// relay sends them. ns/op is per task.
func BenchmarkEnqueue(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	payload := []byte(`{"order":"12345678"}`)
	due := time.Now().Add(time.Hour)
	batch := make([]Task, 100)
	b.ResetTimer()
	for i := 0; i < b.N; i += len(batch) {
		for j := range batch {
			batch[j] = Task{ID: fmt.Sprintf("t-%d", i+j), Payload: payload, RunAt: due}
		}
		if _, err := c.Enqueue(ctx, "q", batch...); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimComplete measures one task's trip through Redis once due: its
// share of a 32-task claim, then its complete.
func BenchmarkClaimComplete(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	tasks := make([]Task, b.N)
	for i := range tasks {
		tasks[i] = Task{ID: fmt.Sprintf("t-%d", i), Payload: []byte("p")}
	}
	if _, err := c.Enqueue(ctx, "q", tasks...); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for done := 0; done < b.N; {
		cl, err := c.Claim(ctx, "q", 32, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if len(cl.Tasks) == 0 {
			b.Fatalf("claimed nothing after %d of %d", done, b.N)
		}
		for _, t := range cl.Tasks {
			if err := c.Complete(ctx, "q", t.ID, t.Token); err != nil {
				b.Fatal(err)
			}
		}
		done += len(cl.Tasks)
	}
}

// BenchmarkClaimControls measures the claim script's cost with the queue's
// controls at work, against none: "plain" (no controls hash), "paused-off" (a
// resumed queue: the flag read), "limited" (a rate limit that never binds: the
// flag and limit read, the GCRA step and its write), "prioritized" (one task in
// two with a priority, 1..9: the priority index read first). Claims of 1 and of
// 32 tasks.
// server_us/claim is Redis's own time in the script (INFO commandstats), which
// the machine's load disturbs less than the round trip.
func BenchmarkClaimControls(b *testing.B) {
	for _, size := range []int{1, 32} {
		for _, mode := range []string{"plain", "paused-off", "limited", "prioritized"} {
			b.Run(fmt.Sprintf("%s/n=%d", mode, size), func(b *testing.B) {
				// A server of its own: commandstats counts every client's scripts.
				c, err := New(testenv.RedisClient(b, testenv.OwnRedis(b).URL()), Config{})
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				switch mode {
				case "paused-off":
					if _, err := c.SetControls(ctx, "q", 1, Controls{}); err != nil {
						b.Fatal(err)
					}
				case "limited":
					if _, err := c.SetControls(ctx, "q", 1, Controls{Rate: RateLimit{Limit: 1_000_000_000, Period: time.Second}}); err != nil {
						b.Fatal(err)
					}
				}
				tasks := make([]Task, b.N*size)
				for i := range tasks {
					tasks[i] = Task{ID: fmt.Sprintf("t-%d", i), Payload: []byte("p")}
					if mode == "prioritized" && i%2 == 1 {
						tasks[i].Priority = 1 + i%9
					}
				}
				for i := 0; i < len(tasks); i += 1000 {
					if _, err := c.Enqueue(ctx, "q", tasks[i:min(i+1000, len(tasks))]...); err != nil {
						b.Fatal(err)
					}
				}
				before := evalUsec(b, c)
				b.ResetTimer()
				for range b.N {
					cl, err := c.Claim(ctx, "q", size, time.Minute)
					if err != nil {
						b.Fatal(err)
					}
					if len(cl.Tasks) != size {
						b.Fatalf("claimed %d, want %d", len(cl.Tasks), size)
					}
				}
				b.StopTimer()
				after := evalUsec(b, c)
				b.ReportMetric(float64(after-before)/float64(b.N), "server_us/claim")
			})
		}
	}
}

// evalUsec is Redis's total time in EVALSHA and EVAL so far, in µs.
func evalUsec(b *testing.B, c *Client) int64 {
	info, err := c.rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\r\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_eval:") {
			continue
		}
		for _, f := range strings.Split(line[strings.Index(line, ":")+1:], ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				total += n
			}
		}
	}
	return total
}

// BenchmarkHistory reads an hour of 20 queues' history (the dashboard's charts):
// 1,200 HGETALLs in one pipelined round trip, each minute with a done count and
// claims in a dozen lateness buckets.
func BenchmarkHistory(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	now := time.Now()
	queues := make([]string, 20)
	for q := range queues {
		queues[q] = fmt.Sprintf("queue-%d", q)
		k, err := c.Keys(queues[q])
		if err != nil {
			b.Fatal(err)
		}
		pipe := c.rdb.Pipeline()
		for m := now.Unix()/60 - 59; m <= now.Unix()/60; m++ {
			key := fmt.Sprintf("%s%d", k.History, m)
			pipe.HIncrBy(ctx, key, "d", 3000)
			for bucket := 20; bucket < 32; bucket++ {
				pipe.HIncrBy(ctx, key, fmt.Sprintf("l%d", bucket), int64(250+bucket))
			}
			pipe.Expire(ctx, key, HistoryRetention)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		h, err := c.History(ctx, now, 60, queues...)
		if err != nil || len(h) != 20 || h["queue-0"][59].Done != 3000 {
			b.Fatalf("%v %v", err, len(h))
		}
	}
}
