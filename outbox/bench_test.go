package outbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

// BenchmarkEnqueueTx measures the producer's path: BEGIN; Enqueue; COMMIT, from
// parallel goroutines (GOMAXPROCS×-cpu of them), each task in its own transaction.
func BenchmarkEnqueueTx(b *testing.B) {
	pool := testenv.Postgres(b)
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := fmt.Sprintf("t-%d", n.Add(1))
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := ob.Enqueue(ctx, tx, outbox.Task{Queue: "bench", ID: id, Payload: []byte(`{"order":"12345678"}`), Delay: time.Hour})
				return err
			})
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkEnqueueMany measures EnqueueMany in batches of 1,000; ns/op is per task.
func BenchmarkEnqueueMany(b *testing.B) {
	pool := testenv.Postgres(b)
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	batch := make([]outbox.Task, 1000)
	b.ResetTimer()
	for i := 0; i < b.N; i += len(batch) {
		for j := range batch {
			batch[j] = outbox.Task{Queue: "bench", ID: fmt.Sprintf("t-%d", i+j), Payload: []byte(`{"order":"12345678"}`), Delay: time.Hour}
		}
		if _, err := ob.EnqueueMany(ctx, pool, batch); err != nil {
			b.Fatal(err)
		}
	}
}
