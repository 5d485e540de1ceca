package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/delayqtype"
)

// running is w with n runs in flight of queue q, ids of idLen bytes.
func running(w delayqtype.Worker, q string, n, idLen int, at time.Time) delayqtype.Worker {
	w.InFlight = n
	w.Running = make([]struct {
		Queue     string    `json:"queue"`
		ID        string    `json:"id"`
		Attempt   int       `json:"attempt"`
		ClaimedAt time.Time `json:"claimed_at"`
	}, n)
	for i := range w.Running {
		e := &w.Running[i]
		e.Queue, e.ID, e.Attempt, e.ClaimedAt = q, fmt.Sprintf("%0*d", idLen, i), 1, at
	}
	return w
}

// The registry's round trip: a beat is listed with what it wrote and the Redis
// clock's times, a second beat keeps the start, a goodbye removes it; a record
// too big keeps fewer runs, never more than the script takes.
func TestWorkerRegistryScripts(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	before := redisNow(t, b.rdb)
	w := delayqtype.Worker{ID: "p1", Host: "h", PID: 42, Version: "v1.2.3", Queues: map[string]int{"a": 2}}
	at := before.Add(-time.Second)
	first, err := b.c.BeatWorker(ctx, running(w, "a", 1, 10, at), time.Minute, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	second, err := b.c.BeatWorker(ctx, w, time.Minute, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := b.c.Workers(ctx)
	if err != nil || len(ws) != 1 {
		t.Fatalf("workers %+v, %v", ws, err)
	}
	g := ws[0]
	if g.ID != "p1" || g.Host != "h" || g.PID != 42 || g.Version != "v1.2.3" || g.Queues["a"] != 2 || g.InFlight != 0 || len(g.Running) != 0 {
		t.Errorf("listed %+v", g)
	}
	if !g.Started.Equal(first) || !g.LastBeat.Equal(second) || !g.LostAt.Equal(second.Add(time.Minute)) || g.Lost || g.ReadAt.Before(second) {
		t.Errorf("times %+v: want started %v, last beat %v", g, first, second)
	}

	// Many long ids: the record is cut to fit, InFlight still counts them all.
	big := running(w, "a", 1000, 200, at)
	if _, err := b.c.BeatWorker(ctx, big, time.Minute, time.Hour); err != nil {
		t.Fatal(err)
	}
	ws, _ = b.c.Workers(ctx)
	if n := len(ws[0].Running); n == 0 || n >= 1000 || ws[0].InFlight != 1000 || ws[0].Running[0].ClaimedAt.UnixMilli() != at.UnixMilli() {
		t.Errorf("a record of 1000 runs of 200-byte ids: %d listed, in flight %d", n, ws[0].InFlight)
	}
	// Queues alone too big: refused, nothing written.
	huge := w
	huge.Queues = map[string]int{}
	for i := range 2000 {
		huge.Queues[fmt.Sprintf("%064d", i)] = 1
	}
	if _, err := b.c.BeatWorker(ctx, huge, time.Minute, time.Hour); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a record of 2000 queues: %v, want ErrInvalidArgument", err)
	}
	for _, bad := range []delayqtype.Worker{{}, {ID: strings.Repeat("i", 65)}} {
		if _, err := b.c.BeatWorker(ctx, bad, time.Minute, time.Hour); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("id %q: %v", bad.ID, err)
		}
	}
	if _, err := b.c.BeatWorker(ctx, w, 0, time.Hour); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("lease 0: %v", err)
	}

	// A short-lived entry expires; the next beat of another drops it from the index.
	if _, err := b.c.BeatWorker(ctx, delayqtype.Worker{ID: "p2"}, time.Millisecond, 0); err != nil {
		t.Fatal(err)
	}
	index, _ := WorkerKeys(b.prefix)
	for deadline := time.Now().Add(10 * time.Second); ; {
		ws, _ = b.c.Workers(ctx)
		if len(ws) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("p2 still listed: %+v", ws)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := b.rdb.ZCard(ctx, index).Val(); n != 2 {
		t.Errorf("index of %d before the next beat, want 2 (p2's entry left)", n)
	}
	if _, err := b.c.BeatWorker(ctx, w, time.Minute, time.Hour); err != nil {
		t.Fatal(err)
	}
	if ids := b.rdb.ZRange(ctx, index, 0, -1).Val(); len(ids) != 1 || ids[0] != "p1" {
		t.Errorf("index %v after a beat, want [p1]", ids)
	}
	if ttl := b.rdb.PTTL(ctx, index).Val(); ttl < 23*time.Hour {
		t.Errorf("index TTL %v, want about a day", ttl)
	}

	if err := b.c.ByeWorker(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	if ws, _ = b.c.Workers(context.Background()); len(ws) != 0 {
		t.Errorf("after goodbye: %+v", ws)
	}
	if n := b.rdb.Exists(ctx, index).Val(); n != 0 {
		t.Errorf("the index outlives its last process")
	}
}
