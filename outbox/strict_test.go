package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/delayq/delayq/outbox"
)

// amount is a payload type that validates itself (value receiver).
type amount struct {
	Cents int `json:"cents"`
}

var errNotPositive = errors.New("not positive")

func (a amount) Validate() error {
	if a.Cents <= 0 {
		return errNotPositive
	}
	return nil
}

// refund validates itself through a pointer receiver.
type refund struct {
	Order string `json:"order"`
}

func (r *refund) Validate() error {
	if r.Order == "" {
		return errors.New("no order")
	}
	return nil
}

// shipment shares no field with charge.
type shipment struct {
	Parcel string `json:"parcel"`
}

func TestJSONCodecStrict(t *testing.T) {
	t.Parallel()
	q := outbox.Queue[charge]{Name: "charge"}
	for _, tc := range []struct {
		payload string
		err     string // "" accepted
	}{
		{`{"order":"o","amount":5}`, ""},
		{" \t\r\n{\"order\":\"o\"}\n\r\t ", ""},
		{`{"order":"o","amount":5,"currency":"EUR"}`, `json: unknown field "currency"`},
		{`{"Order":"o"}`, ""}, // encoding/json matches names without regard to case
		{`{"parcel":"p-1"}`, `json: unknown field "parcel"`},
		{`{"order":"o"}x`, "1 byte after the JSON value (at offset 13)"},
		{`{"order":"o"}{"order":"p"}`, "13 bytes after the JSON value (at offset 13)"},
		{`{"order":"o"}` + "\f", "1 byte after the JSON value"},
		{``, "empty payload"},
		{`  `, "empty payload"},
		{`{"order":"o"`, "unexpected end of JSON input"},
		{`{"amount":"5"}`, "cannot unmarshal string"},
	} {
		_, err := q.Decode([]byte(tc.payload))
		if tc.err == "" {
			if err != nil {
				t.Errorf("%q: %v", tc.payload, err)
			}
			continue
		}
		if !errors.Is(err, outbox.ErrInvalidPayload) || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%q: %v, want ErrInvalidPayload with %q", tc.payload, err, tc.err)
		}
	}

	// Lenient, per queue: encoding/json.Unmarshal's rules.
	lq := outbox.Queue[charge]{Name: "charge", Codec: outbox.JSONCodec{AllowUnknownFields: true}}
	if v, err := lq.Decode([]byte(`{"order":"o","currency":"EUR"}`)); err != nil || v.Order != "o" {
		t.Errorf("lenient: %+v %v", v, err)
	}
	if _, err := lq.Decode([]byte(`{"order":"o"}x`)); !errors.Is(err, outbox.ErrInvalidPayload) {
		t.Errorf("lenient, trailing data: %v", err)
	}
}

func TestQueueDecodeValidates(t *testing.T) {
	t.Parallel()
	aq := outbox.Queue[amount]{Name: "a"}
	if v, err := aq.Decode([]byte(`{"cents":5}`)); err != nil || v.Cents != 5 {
		t.Fatalf("valid: %+v %v", v, err)
	}
	_, err := aq.Decode([]byte(`{"cents":0}`))
	if !errors.Is(err, outbox.ErrInvalidPayload) || !errors.Is(err, errNotPositive) {
		t.Fatalf("invalid value: %v", err)
	}
	mustContain(t, err.Error(), "invalid payload: queue a: outbox_test.amount: not positive")
	// Through a pointer receiver, for T and for *T; a nil *T is not validated.
	if _, err := (outbox.Queue[refund]{Name: "r"}).Decode([]byte(`{}`)); !errors.Is(err, outbox.ErrInvalidPayload) {
		t.Errorf("pointer receiver: %v", err)
	}
	pq := outbox.Queue[*refund]{Name: "r"}
	if _, err := pq.Decode([]byte(`{}`)); !errors.Is(err, outbox.ErrInvalidPayload) {
		t.Errorf("*T: %v", err)
	}
	if v, err := pq.Decode([]byte(`null`)); err != nil || v != nil {
		t.Errorf("nil *T: %v %v", v, err)
	}
	if _, err := (outbox.Queue[*amount]{Name: "a"}).Decode([]byte(`null`)); err != nil {
		t.Errorf("nil *T, value receiver: %v", err)
	}
}

func mustContain(t *testing.T, s, sub string) {
	t.Helper()
	if !strings.Contains(s, sub) {
		t.Errorf("%q does not contain %q", s, sub)
	}
}

func countRows(t *testing.T, b testBundle) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM delayq_outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestQueueValidateAtEnqueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	aq := outbox.Queue[amount]{Name: "a"}
	_, err := aq.Enqueue(ctx, b.client, b.pool, outbox.Task{ID: "zero"}, amount{})
	if !errors.Is(err, outbox.ErrInvalidPayload) || !errors.Is(err, errNotPositive) {
		t.Fatalf("enqueue of an invalid value: %v", err)
	}
	db := b.sqlDB(t)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := (outbox.Queue[refund]{Name: "r"}).EnqueueSQL(ctx, b.client, tx, outbox.Task{ID: "none"}, refund{}); !errors.Is(err, outbox.ErrInvalidPayload) {
		t.Fatalf("EnqueueSQL of an invalid value: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("the transaction is unharmed: %v", err)
	}
	if _, err := aq.Task(outbox.Task{ID: "neg"}, amount{-1}); !errors.Is(err, errNotPositive) {
		t.Fatalf("Task: %v", err)
	}
	if n := countRows(t, b); n != 0 {
		t.Fatalf("%d rows after refused values", n)
	}
	if _, err := aq.Enqueue(ctx, b.client, b.pool, outbox.Task{ID: "ok"}, amount{1}); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, b); n != 1 {
		t.Fatalf("%d rows after a valid value", n)
	}
}

func TestQueueOneTypePerClient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	charges := outbox.Queue[charge]{Name: "charge"}
	shipments := outbox.Queue[shipment]{Name: "charge"} // the mistake: another type, the same name
	if _, err := charges.Enqueue(ctx, b.client, b.pool, outbox.Task{ID: "c-1"}, charge{"c-1", 5}); err != nil {
		t.Fatal(err)
	}
	_, err := shipments.Enqueue(ctx, b.client, b.pool, outbox.Task{ID: "s-1"}, shipment{"p-1"})
	if !errors.Is(err, outbox.ErrQueueType) {
		t.Fatalf("another type for the queue: %v", err)
	}
	mustContain(t, err.Error(), `queue "charge" carries github.com/delayq/delayq/outbox_test.charge on this client, not github.com/delayq/delayq/outbox_test.shipment`)

	// EnqueueMany: the batch is refused whole.
	st, err := shipments.Task(outbox.Task{ID: "s-2"}, shipment{"p-2"})
	if err != nil {
		t.Fatal(err)
	}
	ct, err := charges.Task(outbox.Task{ID: "c-2"}, charge{"c-2", 6})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.EnqueueMany(ctx, b.pool, []outbox.Task{ct, st}); !errors.Is(err, outbox.ErrQueueType) {
		t.Fatalf("EnqueueMany: %v", err)
	}
	if err := shipments.Bind(b.client); !errors.Is(err, outbox.ErrQueueType) {
		t.Fatalf("Bind: %v", err)
	}
	if err := charges.Bind(b.client); err != nil {
		t.Fatalf("Bind of the queue's own type: %v", err)
	}
	if n := countRows(t, b); n != 1 {
		t.Fatalf("%d rows, want the first charge only", n)
	}

	// Raw bytes carry no type: the worker's strict decoding is what catches them.
	if _, err := b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "charge", ID: "raw", Payload: []byte(`{"parcel":"p"}`)}); err != nil {
		t.Fatalf("raw bytes: %v", err)
	}
	// Each client remembers its own: another process's client knows nothing.
	other := newClient(t, outbox.Config{})
	if _, err := shipments.Enqueue(ctx, other, b.pool, outbox.Task{ID: "s-3"}, shipment{"p-3"}); err != nil {
		t.Fatalf("another client: %v", err)
	}
	// A type of the same shape is still another type.
	type chargeCopy charge
	if err := (outbox.Queue[chargeCopy]{Name: "charge"}).Bind(b.client); !errors.Is(err, outbox.ErrQueueType) {
		t.Fatalf("a copy of the type: %v", err)
	}
}

// FuzzJSONCodec checks the strict decoder against encoding/json.Unmarshal: where
// no field can be unknown (a map, any) it accepts exactly what Unmarshal accepts,
// with the same value; into a struct it accepts only what Unmarshal accepts, with
// the same value, and refuses a payload naming a field the struct lacks.
func FuzzJSONCodec(f *testing.F) {
	for _, s := range []string{
		`{"order":"o","amount":5}`, `{"order":"o","currency":"EUR"}`, `{"order":"o"} `, `{"order":"o"}x`,
		`{}{}`, ``, ` `, `null`, `[1,2]`, `"s"`, `{"amount":1e400}`, `{"ORDER":"o"}`, "{\"order\":\"\xff\"}",
		`{"order":"o","order":"p"}`, `{"a":{"b":[1,{"c":null}]}}`,
	} {
		f.Add([]byte(s))
	}
	strict := outbox.JSONCodec{}
	f.Fuzz(func(t *testing.T, p []byte) {
		var got, want any
		errGot, errWant := strict.Decode(p, &got), json.Unmarshal(p, &want)
		if (errGot == nil) != (errWant == nil) || errGot == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("into any: %v %#v; Unmarshal: %v %#v", errGot, got, errWant, want)
		}
		var gc, wc charge
		errGot, errWant = strict.Decode(p, &gc), json.Unmarshal(p, &wc)
		if errGot == nil && (errWant != nil || gc != wc) {
			t.Fatalf("into a struct: %+v accepted; Unmarshal: %v %+v", gc, errWant, wc)
		}
		if errWant == nil && errGot == nil {
			if m, ok := want.(map[string]any); ok {
				for k := range m {
					if !strings.EqualFold(k, "order") && !strings.EqualFold(k, "amount") {
						t.Fatalf("accepted the unknown field %q", k)
					}
				}
			}
		}
	})
}
