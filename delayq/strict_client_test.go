package delayq_test

import (
	"context"
	"errors"
	"testing"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

type parcel struct{ Parcel string }

// One queue name, one payload type, on the one client: a handler's type binds
// the name, and a producer of another type through the client is refused before
// anything is written.
func TestClientOneTypePerQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	rdb, prefix := testenv.Redis(t)
	client, err := delayq.New(pool, rdb, delayq.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if err := delayq.Register(client, payments, func(context.Context, *delayq.Task, payment) error { return nil }, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	parcels := outbox.Queue[parcel]{Name: payments.Name}
	if _, err := parcels.Enqueue(ctx, client, pool, outbox.Task{ID: "p-1"}, parcel{"p-1"}); !errors.Is(err, outbox.ErrQueueType) {
		t.Fatalf("enqueue of another type: %v", err)
	}
	if _, err := parcels.Enqueue(ctx, client.Outbox(), pool, outbox.Task{ID: "p-1"}, parcel{"p-1"}); !errors.Is(err, outbox.ErrQueueType) {
		t.Fatalf("enqueue of another type through the outbox client: %v", err)
	}
	if err := parcels.Bind(client); !errors.Is(err, outbox.ErrQueueType) {
		t.Fatalf("Bind of another type: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows (%v)", n, err)
	}
	if _, err := payments.Enqueue(ctx, client, pool, outbox.Task{ID: "o-1"}, payment{"o-1"}); err != nil {
		t.Fatal(err)
	}
}
