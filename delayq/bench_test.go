package delayq

import (
	"context"
	"fmt"
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
