package dispatch

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
)

// TestWakeUp: a claimer sleeping on a task due in an hour claims a task enqueued
// 50 ms ahead close to its due time.
func TestWakeUp(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxWait: time.Hour}) // no backstop help
	ctx := ctxT(t)
	w := b.c.NewWaiter()
	defer w.Close()
	now := redisNow(t, b.rdb)
	b.enqueue(t, Task{ID: "later", RunAt: now.Add(time.Hour)})

	m, err := w.Mark(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	cl := b.claim(t, 1, time.Minute)
	if len(cl.Tasks) != 0 || cl.NextDue < 59*time.Minute {
		t.Fatalf("first claim %+v", cl)
	}
	woke := make(chan error, 1)
	go func() { woke <- w.Wait(ctx, m, cl.NextDue) }()

	due := redisNow(t, b.rdb).Add(50 * time.Millisecond)
	b.enqueue(t, Task{ID: "soon", RunAt: due})
	if err := <-woke; err != nil {
		t.Fatalf("Wait: %v", err)
	}
	// The usual loop from here on: mark, claim, wait for NextDue.
	var got ClaimedTask
	for got.ID == "" {
		m, err := w.Mark(ctx, "q")
		if err != nil {
			t.Fatal(err)
		}
		cl := b.claim(t, 1, time.Minute)
		if len(cl.Tasks) == 1 {
			got = cl.Tasks[0]
			late := cl.Now.Sub(got.Due)
			t.Logf("claimed %s %v after its due time (Redis clock)", got.ID, late)
			if late < 0 || late > time.Second {
				t.Errorf("lateness %v, want within [0, 1s]", late)
			}
			break
		}
		if cl.NextDue > 100*time.Millisecond {
			t.Fatalf("NextDue %v after the early enqueue", cl.NextDue)
		}
		if err := w.Wait(ctx, m, cl.NextDue); err != nil {
			t.Fatal(err)
		}
	}
	if got.ID != "soon" {
		t.Errorf("claimed %s", got.ID)
	}
}

// TestWakeOnlyForNewHead: scripts publish only when the earliest due time moves
// earlier, so an idle queue with a backlog of later tasks sends nothing.
func TestWakeOnlyForNewHead(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	sub := b.rdb.Subscribe(ctx, b.k.Wake)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // subscription confirmed
		t.Fatal(err)
	}
	base := time.Unix(2_000_000_000, 0)
	b.enqueue(t, Task{ID: "h1", RunAt: base.Add(time.Hour)})        // first head: publish
	b.enqueue(t, Task{ID: "later", RunAt: base.Add(2 * time.Hour)}) // not earlier: silent
	b.enqueue(t, Task{ID: "h1", RunAt: base})                       // duplicate: silent
	b.enqueue(t, Task{ID: "h2", RunAt: base.Add(30 * time.Minute)}) // earlier: publish
	for _, want := range []time.Time{base.Add(time.Hour), base.Add(30 * time.Minute)} {
		msg, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := parseScore(msg.Payload); err != nil || !got.Equal(want) {
			t.Errorf("wake-up for %q (%v), want %v", msg.Payload, err, want)
		}
	}
}

func TestWaitDurations(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxWait: 40 * time.Millisecond})
	ctx := ctxT(t)
	w := b.c.NewWaiter()
	defer w.Close()
	m, err := w.Mark(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := w.Wait(ctx, m, 0); err != nil || time.Since(start) > 20*time.Millisecond {
		t.Errorf("Wait(0): %v after %v", err, time.Since(start))
	}
	start = time.Now()
	if err := w.Wait(ctx, m, -1); err != nil || time.Since(start) < 40*time.Millisecond {
		t.Errorf("Wait(-1) with MaxWait 40ms: %v after %v", err, time.Since(start))
	}
	start = time.Now()
	if err := w.Wait(ctx, m, time.Hour); err != nil || time.Since(start) > 10*time.Second {
		t.Errorf("Wait(1h) with MaxWait 40ms: %v after %v", err, time.Since(start))
	}
	if err := w.Wait(ctx, Mark{}, time.Second); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Wait on a zero Mark: %v", err)
	}
	if _, err := w.Mark(ctx, "bad queue"); !errors.Is(err, ErrInvalidQueue) {
		t.Errorf("Mark(bad queue): %v", err)
	}
}

// A wake-up that lands between the mark and the wait is not lost.
func TestWakeBetweenMarkAndWait(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxWait: time.Hour})
	ctx := ctxT(t)
	w := b.c.NewWaiter()
	defer w.Close()
	m, err := w.Mark(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, Task{ID: "x"})
	if err := w.Wait(ctx, m, time.Hour); err != nil {
		t.Fatal(err)
	}
}

func TestWaiterCloseAndCancel(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxWait: time.Hour})
	ctx := ctxT(t)
	w := b.c.NewWaiter()
	m, err := w.Mark(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	res := make(chan error, 1)
	go func() { res <- w.Wait(cctx, m, time.Hour) }()
	cancel()
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Wait: %v", err)
	}
	go func() { res <- w.Wait(ctx, m, time.Hour) }()
	if err := w.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := <-res; !errors.Is(err, ErrClosed) {
		t.Errorf("Wait during Close: %v", err)
	}
	if _, err := w.Mark(ctx, "q"); !errors.Is(err, ErrClosed) {
		t.Errorf("Mark after Close: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := b.c.NewWaiter().Close(); err != nil { // never connected
		t.Errorf("Close unused: %v", err)
	}
}

// TestRedisRestart: a Redis server that restarts (empty, without persistence, so its
// script cache is gone too) keeps working for the client, and the Waiter's
// resubscription wakes its waiters because wake-ups may have been lost.
func TestRedisRestart(t *testing.T) {
	t.Parallel()
	srv := testenv.OwnRedis(t)
	rdb := testenv.RedisClient(t, srv.URL())
	c, err := New(rdb, Config{MaxWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	w := c.NewWaiter()
	defer w.Close()
	if _, err := c.Enqueue(ctx, "q", Task{ID: "before"}); err != nil {
		t.Fatal(err)
	}
	if cl, err := c.Claim(ctx, "q", 10, time.Minute); err != nil || len(cl.Tasks) != 1 {
		t.Fatalf("claim before restart: %+v %v", cl, err)
	}
	m, err := w.Mark(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	woke := make(chan error, 1)
	go func() { woke <- w.Wait(ctx, m, time.Hour) }()

	srv.Stop()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-woke; err != nil {
		t.Fatalf("Wait across the restart: %v", err)
	}
	var st []EnqueueStatus
	for { // the pool's old connections fail once each; go-redis retries them
		st, err = c.Enqueue(ctx, "q", Task{ID: "after"})
		if err == nil || ctx.Err() != nil {
			break
		}
		t.Logf("first calls after restart: %v", err)
	}
	if err != nil || st[0] != Added {
		t.Fatalf("enqueue after restart: %v %v", st, err)
	}
	cl, err := c.Claim(ctx, "q", 10, time.Minute)
	if err != nil || len(cl.Tasks) != 1 || cl.Tasks[0].ID != "after" {
		t.Fatalf("claim after restart: %+v %v", cl, err)
	}
	if err := c.Complete(ctx, "q", "after", cl.Tasks[0].Token); err != nil {
		t.Fatal(err)
	}

	// Wake-ups flow again on the new connection.
	m, err = w.Mark(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	go func() { woke <- w.Wait(ctx, m, time.Hour) }()
	if _, err := c.Enqueue(ctx, "q", Task{ID: "wake"}); err != nil {
		t.Fatal(err)
	}
	if err := <-woke; err != nil {
		t.Fatal(err)
	}
}
