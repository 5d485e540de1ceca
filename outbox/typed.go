package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
)

// ErrInvalidPayload reports a value its codec could not encode (Queue.Task), or a
// payload it could not decode (Queue.Decode). A worker makes a task whose payload
// does not decode dead at once: it never will.
var ErrInvalidPayload = errors.New("invalid payload")

// Codec turns the values of a typed queue into payloads and back.
type Codec interface {
	Encode(v any) ([]byte, error)
	Decode(payload []byte, v any) error
}

// JSONCodec is the default Codec: encoding/json, decoding strictly. A payload
// with a field the type does not have, or with anything after its JSON value,
// does not decode (ErrInvalidPayload: the task is dead at once), so a
// misspelled field or another type's payload is never run as zero values.
type JSONCodec struct {
	// AllowUnknownFields decodes as encoding/json.Unmarshal does, ignoring fields
	// the type does not have: for a queue whose producers may add a field before
	// its workers know it (a rolling deploy), e.g.
	// Queue[T]{Name: "x", Codec: JSONCodec{AllowUnknownFields: true}}.
	AllowUnknownFields bool
}

// Encode returns the JSON encoding of v.
func (JSONCodec) Encode(v any) ([]byte, error) { return json.Marshal(v) }

// Decode reads the JSON payload into v (see JSONCodec).
func (c JSONCodec) Decode(payload []byte, v any) error {
	return decodeJSON(payload, v, c.AllowUnknownFields)
}

// Queue is a queue whose payloads are values of T. Declare it once, beside T, and
// use it on both sides: producers build tasks with Task (or Enqueue), workers
// register handlers that get a T (delayq.Register, RegisterTx, RegisterSQL). A
// value that does not encode is refused before anything is written; a payload
// that does not decode makes its task dead at once, with the reason.
//
//	var Charges = outbox.Queue[Charge]{Name: "charge"}
//
// If T or *T has a method Validate() error, Task (so Enqueue and EnqueueSQL)
// calls it before encoding and refuses an invalid value (ErrInvalidPayload,
// wrapping Validate's error; nothing written), and Decode calls it after
// decoding, so the worker makes a task whose value is invalid dead at once.
//
// One queue name, one payload type: the worker decodes every task of the queue
// into its handler's T. An outbox Client remembers the T of each queue name a
// Queue enqueued through it or bound to it (Bind; delayq's Register does), and
// refuses a task of another T for that name (ErrQueueType, nothing written); a
// delayq client refuses a second handler for a queue. Across processes nothing
// is recorded: the strict JSONCodec makes a payload of another type dead at
// once when its fields differ (not when they are a subset of T's), and so it
// does for untyped enqueues (raw bytes in Task, the CLI's `delayq enqueue
// --payload`, an edited dead task), which no type checks before the worker.
type Queue[T any] struct {
	// Name is the queue's name (see Task.Queue).
	Name string
	// Codec encodes and decodes the payloads. Default (nil): JSONCodec.
	Codec Codec
}

func (q Queue[T]) codec() Codec {
	if q.Codec == nil {
		return JSONCodec{}
	}
	return q.Codec
}

// Encode returns v's payload.
func (q Queue[T]) Encode(v T) ([]byte, error) {
	p, err := q.codec().Encode(v)
	if err != nil {
		return nil, fmt.Errorf("%w: queue %s: encode %T: %w", ErrInvalidPayload, q.Name, v, err)
	}
	return p, nil
}

// Decode reads a payload of the queue, and checks the value with its Validate
// method if T has one.
func (q Queue[T]) Decode(payload []byte) (T, error) {
	var v T
	if err := q.codec().Decode(payload, &v); err != nil {
		return v, fmt.Errorf("%w: queue %s: decode %T: %w", ErrInvalidPayload, q.Name, v, err)
	}
	return v, q.check(&v)
}

// Task returns t with the queue's name and v's payload: set ID, and Delay, RunAt
// or MaxAttempts as needed, in t. A t naming another queue is refused
// (ErrInvalidQueue).
func (q Queue[T]) Task(t Task, v T) (Task, error) {
	if t.Queue != "" && t.Queue != q.Name {
		return Task{}, fmt.Errorf("%w: task of queue %q built by queue %q", ErrInvalidQueue, t.Queue, q.Name)
	}
	if err := q.check(&v); err != nil {
		return Task{}, err
	}
	p, err := q.Encode(v)
	if err != nil {
		return Task{}, err
	}
	t.Queue, t.Payload, t.payloadType = q.Name, p, reflect.TypeFor[T]()
	return t, nil
}

// Producer is what a typed queue enqueues through: an outbox Client, or the
// delayq client, which holds one.
type Producer interface {
	// Outbox returns the outbox client the enqueue runs on.
	Outbox() *Client
}

// Outbox returns c: an outbox Client is a Producer.
func (c *Client) Outbox() *Client { return c }

// Enqueue enqueues t with v's payload through p, in db, the caller's
// transaction (see Client.Enqueue).
func (q Queue[T]) Enqueue(ctx context.Context, p Producer, db Querier, t Task, v T) (Result, error) {
	t, err := q.Task(t, v)
	if err != nil {
		return Result{}, err
	}
	return p.Outbox().Enqueue(ctx, db, t)
}

// EnqueueSQL is Enqueue in a database/sql transaction (see Client.EnqueueSQL).
func (q Queue[T]) EnqueueSQL(ctx context.Context, p Producer, tx SQLQuerier, t Task, v T) (Result, error) {
	t, err := q.Task(t, v)
	if err != nil {
		return Result{}, err
	}
	return p.Outbox().EnqueueSQL(ctx, tx, t)
}
