package dispatch

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
)

// fuzzMaxPayload is the payload limit of FuzzPayloadRoundTrip's client: small, so
// the fuzzer reaches both sides of it.
const fuzzMaxPayload = 512

// FuzzPayloadRoundTrip enqueues fuzzed payload bytes on a real Redis and claims
// them back: a payload within the limit comes back byte for byte (NUL, invalid
// UTF-8, Lua-looking text alike), through Inspect too; one over the limit is
// refused with ErrInvalidTask and writes nothing.
func FuzzPayloadRoundTrip(f *testing.F) {
	f.Add([]byte(`{"order":1001}`), uint16(0))
	f.Add([]byte{}, uint16(0))
	f.Add([]byte{0, 0xff, 0xfe, '\n', 0}, uint16(3))
	f.Add([]byte("\x1b[31m\"; redis.call('FLUSHALL') --"), uint16(0))
	f.Add(bytes.Repeat([]byte("é"), 100), uint16(fuzzMaxPayload-200))
	f.Add([]byte("x"), uint16(fuzzMaxPayload-1))
	f.Add([]byte("x"), uint16(fuzzMaxPayload))
	rdb, prefix := testenv.Redis(f)
	c, err := New(rdb, Config{Prefix: prefix, MaxPayloadBytes: fuzzMaxPayload, DoneRetention: -1})
	if err != nil {
		f.Fatal(err)
	}
	const queue = "fuzz"
	n := 0
	f.Fuzz(func(t *testing.T, data []byte, pad uint16) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		payload := append(bytes.Clone(data), make([]byte, min(int(pad), 4*fuzzMaxPayload))...)
		n++
		id := "p-" + strconv.Itoa(n)
		_, err := c.Enqueue(ctx, queue, Task{ID: id, Payload: payload})
		if len(payload) > fuzzMaxPayload {
			if !errors.Is(err, ErrInvalidTask) {
				t.Fatalf("payload of %d bytes: %v, want ErrInvalidTask", len(payload), err)
			}
			info, err := c.Inspect(ctx, queue, id)
			if err != nil || info[0].State != StateMissing {
				t.Fatalf("refused task written: %+v %v", info, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("Enqueue %d bytes: %v", len(payload), err)
		}
		info, err := c.Inspect(ctx, queue, id)
		if err != nil || !bytes.Equal(info[0].Payload, payload) {
			t.Fatalf("Inspect: payload %q, want %q (%v)", info[0].Payload, payload, err)
		}
		cl, err := c.Claim(ctx, queue, 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(cl.Tasks) != 1 || cl.Tasks[0].ID != id {
			t.Fatalf("claimed %+v, want only %s", cl.Tasks, id)
		}
		if got := cl.Tasks[0].Payload; !bytes.Equal(got, payload) {
			t.Fatalf("claimed payload %q, want %q", got, payload)
		}
		if err := c.Complete(ctx, queue, id, cl.Tasks[0].Token); err != nil {
			t.Fatal(err)
		}
	})
}
