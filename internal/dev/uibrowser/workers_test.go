package uibrowser

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// TestBrowserWorkers: an operator, in a browser and without the CLI, finds which
// worker processes run and what each is doing: from the nav to the Workers page,
// two live processes with their queues and the tasks their handlers are running,
// one process killed without a goodbye shown as lost, and a running task's link
// to its page. It has a browser of its own (TestBrowser's is not shared across
// tests) and leaves docs/ui-workers.png's screenshot in the screenshots folder.
func TestBrowserWorkers(t *testing.T) {
	t.Parallel()
	b := newBrowser(t, 1400, 900)

	e := newEnv(t)
	rl, err := relay.New(e.pool, e.dq.AsRedis(), relay.Config{PollInterval: 50 * time.Millisecond, ReapInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	release := make(chan struct{})
	t.Cleanup(func() { close(release); cancel(); wg.Wait() })
	wg.Go(func() { _ = rl.Run(ctx) })
	// Two worker processes (two clients here): one runs reports, the other
	// emails and payments.
	started := make(chan string, 10)
	blocking := func(ctx context.Context, tk *delayq.Task) error {
		started <- tk.ID
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}
	for _, queues := range []map[string]int{{"reports": 2}, {"emails": 10, "payments": 4}} {
		w, err := clientkit.NewClient(e.pool, e.dq, e.ob, delayq.WorkerConfig{Lease: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		for q, n := range queues {
			if err := w.Handle(q, blocking, delayq.QueueConfig{Concurrency: n}); err != nil {
				t.Fatal(err)
			}
		}
		wg.Go(func() { _ = w.Run(ctx) })
	}
	e.enqueue(t,
		outbox.Task{Queue: "reports", ID: "monthly-2026-11", Payload: []byte(`{}`)},
		outbox.Task{Queue: "payments", ID: "refund-8812", Payload: []byte(`{}`)},
		outbox.Task{Queue: "emails", ID: "welcome-310", Payload: []byte(`{}`)},
	)
	for range 3 {
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the handlers did not start")
		}
	}
	// A third process, killed: its last beat is in Redis, and no goodbye.
	lost := delayqtype.Worker{ID: "5f1c0ffee0ddba11", Host: "batch-3", PID: 7311, Version: "v1.3.2",
		Queues: map[string]int{"exports": 1}}
	if _, err := e.dq.BeatWorker(ctxT(t), lost, time.Millisecond, time.Hour); err != nil {
		t.Fatal(err)
	}

	_, run := b.tab(t)
	var buf []byte
	var live, lostN, inFlight, status, title string
	var runs, workers int
	deadline := time.Now().Add(30 * time.Second)
	run(chromedp.Navigate(e.srv.URL + "/"))
	for {
		// From the nav, as an operator would (reads need no login here).
		run(chromedp.Click(`nav a[href$="/workers"]`, chromedp.ByQuery),
			chromedp.WaitVisible(`main h1`, chromedp.ByQuery),
			chromedp.Evaluate(`document.querySelectorAll('#runs tr[data-run]').length`, &runs))
		if runs == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the workers page listed %d runs, want 3", runs)
		}
		time.Sleep(50 * time.Millisecond) // the next beat lists the runs: reload until it has
		run(chromedp.Navigate(e.srv.URL + "/"))
	}
	run(chromedp.Text(`main h1`, &title, chromedp.ByQuery),
		chromedp.Text(`[data-live]`, &live, chromedp.ByQuery),
		chromedp.Text(`[data-lost]`, &lostN, chromedp.ByQuery),
		chromedp.Text(`[data-in-flight]`, &inFlight, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('#workers tr[data-worker]').length`, &workers),
		chromedp.Text(`tr[data-worker="5f1c0ffee0ddba11"] td:nth-child(5)`, &status, chromedp.ByQuery),
		b.screenshot("workers", &buf),
	)
	if title != "Workers" || live != "2" || lostN != "1" || inFlight != "3" || workers != 3 || status != "lost" {
		t.Fatalf("workers page: title %q, %s running, %s lost, %s in flight, %d rows, the killed one %q",
			title, live, lostN, inFlight, workers, status)
	}
	var queues string
	run(chromedp.Text(`tr[data-worker]:not([data-status="lost"]) a[data-queue="payments"]`, &queues, chromedp.ByQuery))
	if queues != "payments" {
		t.Fatalf("payments not listed among a live worker's queues: %q", queues)
	}
	// What is that process doing? The run's link leads to the task's page.
	var state string
	run(chromedp.Click(`tr[data-run="payments/refund-8812"] a`, chromedp.ByQuery),
		chromedp.WaitVisible(`#pg-state`, chromedp.ByQuery),
		chromedp.Text(`#pg-state`, &state, chromedp.ByQuery))
	if !strings.Contains(state, "queued") {
		t.Fatalf("the running task's page: state %q, want queued", state)
	}
}
