package outbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
)

// decodeJSON reads the one JSON value of payload into v. Strict (the default):
// a field v has no place for is refused, as is anything after the value but
// JSON whitespace, so a producer's misspelled field or another type's payload
// fails instead of reaching the handler as zero values. Lenient: exactly
// encoding/json.Unmarshal.
func decodeJSON(payload []byte, v any, allowUnknownFields bool) error {
	if allowUnknownFields {
		return json.Unmarshal(payload, v)
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	switch err := dec.Decode(v); {
	case errors.Is(err, io.EOF):
		return errors.New("empty payload: no JSON value")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("unexpected end of JSON input") // json.Unmarshal's words
	case err != nil && strings.HasPrefix(err.Error(), "json: unknown field "):
		// A producer's misspelling, or a newer producer: say how to accept it.
		return fmt.Errorf("%w (a field the type lacks; JSONCodec{AllowUnknownFields: true} ignores such fields)", err)
	case err != nil:
		return err
	}
	if rest := bytes.TrimLeft(payload[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		unit := "bytes"
		if len(rest) == 1 {
			unit = "byte"
		}
		return fmt.Errorf("%d %s after the JSON value (at offset %d)", len(rest), unit, len(payload)-len(rest))
	}
	return nil
}

// validator is what a payload type implements to have its values checked at
// enqueue and after decoding (see Queue).
type validator interface{ Validate() error }

// validatePayload calls v's Validate, if T or *T has one; not on a nil pointer.
func validatePayload[T any](v *T) error {
	if x, ok := any(v).(validator); ok {
		return x.Validate()
	}
	x, ok := any(*v).(validator)
	if !ok {
		return nil
	}
	if rv := reflect.ValueOf(x); rv.Kind() == reflect.Pointer && rv.IsNil() {
		return nil
	}
	return x.Validate()
}

// check runs v's Validate, if any.
func (q Queue[T]) check(v *T) error {
	if err := validatePayload(v); err != nil {
		return fmt.Errorf("%w: queue %s: %T: %w", ErrInvalidPayload, q.Name, *v, err)
	}
	return nil
}

// Bind records T as the payload type of q's queue on p's outbox client, as
// Enqueue, EnqueueSQL and EnqueueMany do for each task q built: a task of
// another type for the same queue name is then refused there (ErrQueueType),
// and Bind fails (ErrQueueType) if the client has seen another type for it
// already. delayq's Register, RegisterTx and RegisterSQL bind their client, so
// one process's producers and handlers agree.
func (q Queue[T]) Bind(p Producer) error {
	return p.Outbox().payloadTypes.bind(q.Name, reflect.TypeFor[T]())
}

// payloadTypes remembers the payload type of each queue name a client enqueued
// through a typed Queue (or was bound by Queue.Bind); nothing of it is stored
// with the tasks.
type payloadTypes struct {
	m sync.Map // queue name → reflect.Type
}

// bind records typ for queue, or fails if another type is recorded. A nil typ
// (a task with raw bytes) binds nothing.
func (p *payloadTypes) bind(queue string, typ reflect.Type) error {
	if typ == nil {
		return nil
	}
	prev, loaded := p.m.LoadOrStore(queue, typ)
	if loaded && prev != typ {
		return fmt.Errorf("%w: queue %q carries %s on this client, not %s: declare one outbox.Queue per queue name",
			ErrQueueType, queue, typeName(prev.(reflect.Type)), typeName(typ))
	}
	return nil
}

// typeName names a type with its package path, so that two types of one short
// name are told apart.
func typeName(t reflect.Type) string {
	if t.Name() != "" && t.PkgPath() != "" {
		return t.PkgPath() + "." + t.Name()
	}
	return t.String()
}

// admit checks t as Validate does, and its payload type against the queue's
// on c when a typed Queue built it.
func (c *Client) admit(t Task) error {
	if err := c.Validate(t); err != nil {
		return err
	}
	return c.payloadTypes.bind(t.Queue, t.payloadType)
}
