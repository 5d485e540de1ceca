package delayq

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/outbox"
)

// strictCharge is the worker's payload type, as in issue 31: no Validate.
type strictCharge struct {
	AmountCents int `json:"amount_cents"`
}

// validCharge validates itself.
type validCharge strictCharge

func (c validCharge) Validate() error {
	if c.AmountCents <= 0 {
		return errors.New("amount_cents must be positive")
	}
	return nil
}

// strictOther is another service's type, declared (by mistake) for the same
// queue name: it shares no field with strictCharge.
type strictOther struct {
	Parcel string `json:"parcel"`
}

// untyped returns t as another process's producer sends it: its client never
// saw the worker's type.
func untyped(t outbox.Task) outbox.Task {
	return outbox.Task{Queue: t.Queue, ID: t.ID, Payload: t.Payload, MaxAttempts: 5}
}

func TestStrictPayloads(t *testing.T) {
	t.Parallel()
	b := setup(t)
	charges := outbox.Queue[strictCharge]{Name: "charge"}
	valid := outbox.Queue[validCharge]{Name: "valid"}
	got := make(chan int, 10)
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		if err := Register(clientOf(w), charges, func(_ context.Context, _ *Task, c strictCharge) error {
			got <- c.AmountCents
			return nil
		}, QueueConfig{}); err != nil {
			t.Error(err)
		}
		if err := Register(clientOf(w), valid, func(_ context.Context, _ *Task, c validCharge) error {
			got <- c.AmountCents
			return nil
		}, QueueConfig{}); err != nil {
			t.Error(err)
		}
	})

	// The reproduction of issue 31: Queue[Other] producer, Queue[Charge] worker.
	other, err := (outbox.Queue[strictOther]{Name: "charge"}).Task(outbox.Task{ID: "other"}, strictOther{"p-1"})
	if err != nil {
		t.Fatal(err)
	}
	ok, err := charges.Task(outbox.Task{ID: "ok"}, strictCharge{500})
	if err != nil {
		t.Fatal(err)
	}
	raw := func(queue, id, payload string) outbox.Task {
		return outbox.Task{Queue: queue, ID: id, Payload: []byte(payload), MaxAttempts: 5}
	}
	tasks := []outbox.Task{
		untyped(other),
		raw("charge", "misspelled", `{"amount":500}`), // delayq enqueue --payload '{"amount":500}'
		raw("charge", "trailing", `{"amount_cents":500}}`),
		raw("valid", "invalid", `{"amount_cents":0}`),
		untyped(ok),
	}
	b.enqueue(t, tasks...)
	want := map[string]struct {
		out outcome
		err string
	}{
		"other":      {outDead, `invalid payload: queue charge: decode delayq.strictCharge: json: unknown field "parcel" (a field the type lacks; JSONCodec{AllowUnknownFields: true} ignores such fields)`},
		"misspelled": {outDead, `invalid payload: queue charge: decode delayq.strictCharge: json: unknown field "amount" (a field the type lacks; JSONCodec{AllowUnknownFields: true} ignores such fields)`},
		"trailing":   {outDead, `invalid payload: queue charge: decode delayq.strictCharge: 1 byte after the JSON value (at offset 20)`},
		"invalid":    {outDead, `invalid payload: queue valid: delayq.validCharge: amount_cents must be positive`},
		"ok":         {outSucceeded, ""},
	}
	for range tasks {
		f := h.next(t)
		w, found := want[f.task.ID]
		if !found || f.out != w.out {
			t.Fatalf("run of %s ended %q; log:\n%s", f.task.ID, f.out, h.logs)
		}
		r := b.row(t, f.task.Queue, f.task.ID)
		if w.out == outDead && (r.state != "dead" || r.attempt != 1 || r.lastError != w.err) {
			t.Errorf("%s: row %+v, want dead on attempt 1 with %q", f.task.ID, r, w.err)
		}
	}
	if c := <-got; c != 500 {
		t.Errorf("handler got %d", c)
	}
	if len(got) != 0 {
		t.Errorf("%d more runs reached the handler", len(got))
	}
	if s := h.w.Stats(); s.Dead != 4 || s.Retried != 0 {
		t.Errorf("stats %+v, want 4 dead, none retried", s)
	}
}

func TestOneTypePerQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	charges := outbox.Queue[strictCharge]{Name: "charge"}
	others := outbox.Queue[strictOther]{Name: "charge"}
	b.start(t, WorkerConfig{}, func(w *worker) {
		if err := RegisterTx(clientOf(w), charges, func(context.Context, pgx.Tx, *Task, strictCharge) error { return nil }, QueueConfig{}); err != nil {
			t.Error(err)
		}
		// A second handler for the queue, of either type, is refused.
		if err := Register(clientOf(w), others, func(context.Context, *Task, strictOther) error { return nil }, QueueConfig{}); !errors.Is(err, outbox.ErrQueueType) {
			t.Errorf("a second type's handler: %v", err)
		}
		if err := Register(clientOf(w), charges, func(context.Context, *Task, strictCharge) error { return nil }, QueueConfig{}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("a second handler: %v", err)
		}
		// Registration binds the worker's outbox client, the producer's here.
		if err := Register(clientOf(w), outbox.Queue[strictOther]{Name: "parcel"}, func(context.Context, *Task, strictOther) error { return nil }, QueueConfig{}); err != nil {
			t.Error(err)
		}
	})
	if _, err := others.Enqueue(ctx, b.ob, b.pool, outbox.Task{ID: "o-1"}, strictOther{"p-1"}); !errors.Is(err, outbox.ErrQueueType) {
		t.Fatalf("enqueue of another type on the worker's client: %v", err)
	}
	if _, err := (outbox.Queue[strictCharge]{Name: "parcel"}).Enqueue(ctx, b.ob, b.pool, outbox.Task{ID: "c-1"}, strictCharge{1}); !errors.Is(err, outbox.ErrQueueType) {
		t.Fatalf("enqueue of another type on the worker's client: %v", err)
	}
	if _, err := charges.Enqueue(ctx, b.ob, b.pool, outbox.Task{ID: "c-1"}, strictCharge{1}); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM delayq_outbox`); n != 1 {
		t.Fatalf("%d rows, want the one of the queue's type", n)
	}
}
