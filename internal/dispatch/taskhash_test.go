package dispatch

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/validate"
)

// TestTaskHashLeavesOutDefaults checks the layout Keys.TaskKey documents: a new task
// is written with its payload and only the fields that differ from their defaults,
// and every reader reports the defaults for the absent ones.
func TestTaskHashLeavesOutDefaults(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb).Add(-time.Second)
	b.enqueue(t,
		Task{ID: "plain", Payload: []byte("p1"), RunAt: now},
		Task{ID: "custom", Payload: []byte("p2"), RunAt: now, MaxAttempts: 3, Version: 2, Attempt: 1},
		Task{ID: "empty", RunAt: now},
	)
	for id, want := range map[string]map[string]string{
		"plain":  {"p": "p1"},
		"custom": {"p": "p2", "m": "3", "v": "2", "a": "1"},
		"empty":  {"p": ""},
	} {
		got, err := b.rdb.HGetAll(ctx, b.k.TaskKey(id)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("hash of %s = %v, want %v", id, got, want)
		}
	}

	// Readers: inspect, a duplicate enqueue, a replacing one, and claim.
	if ti := b.info(t, "plain"); ti.State != StateReady || ti.MaxAttempts != 25 || ti.Version != 1 || ti.Attempt != 0 {
		t.Errorf("inspect plain: %+v", ti)
	}
	if st := b.enqueue(t, Task{ID: "plain", RunAt: now}, Task{ID: "empty", RunAt: now, Version: 2}); st[0] != Duplicate || st[1] != Replaced {
		t.Errorf("enqueue again: %v, want [duplicate replaced]", st)
	}
	cl := b.claim(t, 10, time.Minute)
	got := map[string]ClaimedTask{}
	for _, ct := range cl.Tasks {
		got[ct.ID] = ct
	}
	if ct := got["plain"]; len(cl.Tasks) != 3 || ct.MaxAttempts != 25 || ct.Version != 1 || ct.Attempt != 1 || string(ct.Payload) != "p1" {
		t.Errorf("claimed %+v", cl.Tasks)
	}
	if ct := got["custom"]; ct.MaxAttempts != 3 || ct.Version != 2 || ct.Attempt != 2 {
		t.Errorf("claimed custom %+v", ct)
	}
	if ct := got["empty"]; ct.MaxAttempts != 25 || ct.Version != 2 || ct.Payload == nil || len(ct.Payload) != 0 {
		t.Errorf("claimed empty %+v", ct)
	}
	// A compact task reaches its default max attempts like any other: 25 retries
	// make it dead, not 1.
	if err := b.c.Complete(ctx, "q", "empty", got["empty"].Token); err != nil {
		t.Fatal(err)
	}
	dead, err := b.c.Retry(ctx, "q", "plain", got["plain"].Token, time.Millisecond, "boom")
	if err != nil || dead {
		t.Fatalf("Retry of a compact task at attempt 1 of 25: dead %v, err %v", dead, err)
	}
}

// TestTaskHashExplicitFields checks that hashes written with every field explicit
// (as delayq wrote them before leaving defaults out) are still read right.
func TestTaskHashExplicitFields(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	due := float64(redisNow(t, b.rdb).Add(-time.Second).UnixMilli()) / 1000
	if err := b.rdb.HSet(ctx, b.k.TaskKey("old"), "s", "r", "p", "x", "m", "3", "v", "4").Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.rdb.ZAdd(ctx, b.k.Ready, redisZ("old", due)).Err(); err != nil {
		t.Fatal(err)
	}
	if st := b.enqueue(t, Task{ID: "old", Version: 4}); st[0] != Duplicate {
		t.Errorf("enqueue of the same version: %v", st)
	}
	cl := b.claim(t, 10, time.Minute)
	if len(cl.Tasks) != 1 || cl.Tasks[0].MaxAttempts != 3 || cl.Tasks[0].Version != 4 || string(cl.Tasks[0].Payload) != "x" {
		t.Fatalf("claimed %+v", cl.Tasks)
	}
}

// TestTraceContext: a task's trace context is kept in field c only when given (a
// task without one keeps its one-field hash), handed out by claim, replaced or
// dropped with a new version, and refused past 512 bytes or outside printable
// ASCII before anything is written.
func TestTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb).Add(-time.Second)
	const tc = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 vendor=a;b"
	b.enqueue(t,
		Task{ID: "traced", Payload: []byte("p"), RunAt: now, TraceContext: tc},
		Task{ID: "plain", Payload: []byte("p"), RunAt: now},
		Task{ID: "dropped", Payload: []byte("p"), RunAt: now, TraceContext: tc},
	)
	for id, want := range map[string]map[string]string{
		"traced": {"p": "p", "c": tc},
		"plain":  {"p": "p"},
	} {
		if got, err := b.rdb.HGetAll(ctx, b.k.TaskKey(id)).Result(); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("hash of %s = %v (%v), want %v", id, got, err, want)
		}
	}
	// A new version replaces the trace context, or drops it.
	if st := b.enqueue(t, Task{ID: "plain", RunAt: now, Version: 2, TraceContext: "x"},
		Task{ID: "dropped", RunAt: now, Version: 2}); st[0] != Replaced || st[1] != Replaced {
		t.Fatalf("replace: %v", st)
	}
	got := map[string]string{}
	for _, ct := range b.claim(t, 10, time.Minute).Tasks {
		got[ct.ID] = ct.TraceContext
	}
	if want := map[string]string{"traced": tc, "plain": "x", "dropped": ""}; !reflect.DeepEqual(got, want) {
		t.Errorf("claimed trace contexts %v, want %v", got, want)
	}
	for _, bad := range []string{strings.Repeat("c", 513), "a\nb", "\x00", "é"} {
		_, err := b.c.Enqueue(ctx, "q", Task{ID: "bad", Payload: []byte("p"), TraceContext: bad})
		if !errors.Is(err, ErrInvalidTask) || !errors.Is(err, validate.ErrInvalidTraceContext) {
			t.Errorf("trace context %q: %v, want ErrInvalidTask and ErrInvalidTraceContext", bad, err)
		}
	}
	if n, _ := b.rdb.Exists(ctx, b.k.TaskKey("bad")).Result(); n != 0 {
		t.Error("a refused task was written")
	}
}
