package relay_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// fuzzMaxPayload is the outbox's and Redis's payload limit in the fuzz target:
// small, so the fuzzer reaches both sides of it.
const fuzzMaxPayload = 512

// FuzzPayloadThroughRelay takes fuzzed payload bytes the whole way: enqueued in
// PostgreSQL by one of the four enqueue paths (pgx or database/sql, one task or
// many), moved by a relay round, claimed from Redis. Within the limit they arrive
// byte for byte; over it, every path refuses them with ErrPayloadTooLarge and
// writes no row.
func FuzzPayloadThroughRelay(f *testing.F) {
	f.Add([]byte(`{"order":1001}`), uint16(0), uint8(0))
	f.Add([]byte{}, uint16(0), uint8(1))
	f.Add([]byte{0, 0xff, '\\', 'x', '0', '0', '\''}, uint16(5), uint8(2))
	f.Add([]byte("'); DROP TABLE delayq_outbox; --"), uint16(0), uint8(3))
	f.Add([]byte("x"), uint16(fuzzMaxPayload-1), uint8(0))
	f.Add([]byte("x"), uint16(fuzzMaxPayload), uint8(2))
	ctx := context.Background()
	pool := testenv.Postgres(f)
	rdb, prefix := testenv.Redis(f)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix, MaxPayloadBytes: fuzzMaxPayload, DoneRetention: -1})
	if err != nil {
		f.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{MaxPayloadBytes: fuzzMaxPayload})
	if err != nil {
		f.Fatal(err)
	}
	rl, err := relay.New(pool, dq.AsRedis(), relay.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		f.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool)
	f.Cleanup(func() { db.Close() })
	const queue = "fuzz"
	n := 0
	f.Fuzz(func(t *testing.T, data []byte, pad uint16, path uint8) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		payload := append(bytes.Clone(data), make([]byte, min(int(pad), 4*fuzzMaxPayload))...)
		n++
		task := outbox.Task{Queue: queue, ID: "p-" + strconv.Itoa(n), Payload: payload}
		var err error
		switch path % 4 {
		case 0:
			_, err = ob.Enqueue(ctx, pool, task)
		case 1:
			_, err = ob.EnqueueSQL(ctx, db, task)
		case 2:
			_, err = ob.EnqueueMany(ctx, pool, []outbox.Task{task})
		default:
			_, err = ob.EnqueueManySQL(ctx, db, []outbox.Task{task})
		}
		var rows int
		if qerr := pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE task_id = $1`, task.ID).Scan(&rows); qerr != nil {
			t.Fatal(qerr)
		}
		if len(payload) > fuzzMaxPayload {
			if !errors.Is(err, outbox.ErrPayloadTooLarge) || rows != 0 {
				t.Fatalf("path %d, payload of %d bytes: %v, %d rows; want ErrPayloadTooLarge and none", path%4, len(payload), err, rows)
			}
			return
		}
		if err != nil || rows != 1 {
			t.Fatalf("path %d: enqueue %d bytes: %v, %d rows", path%4, len(payload), err, rows)
		}
		if moved, err := rl.Round(ctx); err != nil || moved != 1 {
			t.Fatalf("relay round: %d rows, %v", moved, err)
		}
		cl := claimWhenDue(ctx, t, dq, queue)
		if len(cl.Tasks) != 1 || cl.Tasks[0].ID != task.ID {
			t.Fatalf("claimed %+v, want only %s", cl.Tasks, task.ID)
		}
		if got := cl.Tasks[0].Payload; !bytes.Equal(got, payload) {
			t.Fatalf("path %d: claimed payload %q, want %q", path%4, got, payload)
		}
		if err := dq.Complete(ctx, queue, task.ID, cl.Tasks[0].Token); err != nil {
			t.Fatal(err)
		}
	})
}

// claimWhenDue claims from queue once something is due by the Redis clock: a task
// due "now" on the database clock may still lie a fraction of a millisecond ahead
// for Redis (due times round up to the millisecond), so the first claim can find
// it not yet due. It then waits for the NextDue that claim reported.
func claimWhenDue(ctx context.Context, t *testing.T, dq *dispatch.Client, queue string) dispatch.Claim {
	t.Helper()
	for {
		cl, err := dq.Claim(ctx, queue, 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(cl.Tasks) > 0 || cl.NextDue <= 0 {
			return cl
		}
		if cl.NextDue > time.Second {
			t.Fatalf("nothing due; the next task falls due in %v", cl.NextDue)
		}
		timer := time.NewTimer(cl.NextDue)
		select {
		case <-ctx.Done():
			timer.Stop()
			t.Fatal(ctx.Err())
		case <-timer.C:
		}
	}
}
