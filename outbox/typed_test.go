package outbox_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/delayq/delayq/outbox"
)

type charge struct {
	Order  string `json:"order"`
	Amount int    `json:"amount"`
}

// markedCodec is a codec of the test's own: JSON, marked.
type markedCodec struct{}

func (markedCodec) Encode(v any) ([]byte, error) {
	p, err := outbox.JSONCodec{}.Encode(v)
	return append([]byte("M"), p...), err
}

func (markedCodec) Decode(p []byte, v any) error {
	if len(p) == 0 || p[0] != 'M' {
		return errors.New("not marked")
	}
	return outbox.JSONCodec{}.Decode(p[1:], v)
}

func TestQueueEnqueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	q := outbox.Queue[charge]{Name: "charge"}
	res, err := q.Enqueue(ctx, b.client, b.pool, outbox.Task{ID: "o-1", Delay: time.Hour}, charge{"o-1", 1200})
	if err != nil || res.Duplicate {
		t.Fatalf("enqueue: %+v %v", res, err)
	}
	var payload []byte
	var queue string
	if err := b.pool.QueryRow(ctx, `SELECT queue, payload FROM delayq_outbox WHERE task_id = 'o-1'`).Scan(&queue, &payload); err != nil {
		t.Fatal(err)
	}
	if queue != "charge" || string(payload) != `{"order":"o-1","amount":1200}` {
		t.Fatalf("row: %s %s", queue, payload)
	}
	v, err := q.Decode(payload)
	if err != nil || v != (charge{"o-1", 1200}) {
		t.Fatalf("decode: %+v %v", v, err)
	}

	// database/sql, and a codec of one's own.
	mq := outbox.Queue[charge]{Name: "marked", Codec: markedCodec{}}
	db := b.sqlDB(t)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mq.EnqueueSQL(ctx, b.client, tx, outbox.Task{ID: "o-2"}, charge{"o-2", 1}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(ctx, `SELECT payload FROM delayq_outbox WHERE queue = 'marked' AND task_id = 'o-2'`).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	if string(payload) != `M{"order":"o-2","amount":1}` {
		t.Fatalf("payload %s", payload)
	}
	if _, err := q.Decode(payload); !errors.Is(err, outbox.ErrInvalidPayload) {
		t.Fatalf("JSON decode of a marked payload: %v", err)
	}
}

func TestQueueRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	fq := outbox.Queue[float64]{Name: "f"}
	if _, err := fq.Enqueue(ctx, b.client, b.pool, outbox.Task{ID: "nan"}, math.NaN()); !errors.Is(err, outbox.ErrInvalidPayload) {
		t.Fatalf("NaN: %v", err)
	}
	q := outbox.Queue[charge]{Name: "charge"}
	if _, err := q.Task(outbox.Task{Queue: "other", ID: "x"}, charge{}); !errors.Is(err, outbox.ErrInvalidQueue) {
		t.Fatalf("other queue: %v", err)
	}
	if _, err := (outbox.Queue[charge]{Name: "bad name"}).Enqueue(ctx, b.client, b.pool, outbox.Task{ID: "x"}, charge{}); !errors.Is(err, outbox.ErrInvalidQueue) {
		t.Fatalf("bad queue name: %v", err)
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows after refusals (%v)", n, err)
	}
}
