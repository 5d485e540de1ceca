package uibrowser

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// TestBrowserAttempts: an operator opens the page of a task that failed, then
// panicked, then succeeded, reads why each run failed, and opens the panic's
// stack. Its own browser process (TestBrowser's subtests share one).
func TestBrowserAttempts(t *testing.T) {
	t.Parallel()
	b := newBrowser(t, 1400, 900)

	e := newEnv(t)
	runAttemptsSystem(t, e, "sync")
	e.enqueue(t, outbox.Task{Queue: "sync", ID: "crm-17", Payload: []byte(`{"account":17}`)})
	e.waitState(t, "sync", "crm-17", taskstate.Done)

	_, run := b.tab(t)
	var buf []byte
	var rows int
	var outcomes, firstErr, stack string
	var stackShown bool
	run(login(e),
		chromedp.Navigate(e.srv.URL+"/task?queue=sync&id=crm-17"),
		chromedp.WaitVisible(`#attempts`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('#attempts tr.attempt').length`, &rows),
		chromedp.Evaluate(`[...document.querySelectorAll('#attempts .outcome')].map(e => e.textContent).join(',')`, &outcomes),
		chromedp.Text(`#attempts tr.attempt td.err`, &firstErr, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelector('#attempts details.stack pre').checkVisibility()`, &stackShown),
	)
	if rows != 3 || outcomes != "retried,retried,succeeded" || !strings.Contains(firstErr, "crm: 503 <unavailable>") {
		t.Fatalf("attempts: %d rows, outcomes %q, first error %q", rows, outcomes, firstErr)
	}
	if stackShown {
		t.Fatal("the stack is open before the operator asks for it")
	}
	run(chromedp.Click(`#attempts details.stack summary`, chromedp.ByQuery),
		chromedp.WaitVisible(`#attempts details.stack pre`, chromedp.ByQuery),
		chromedp.Text(`#attempts details.stack pre`, &stack, chromedp.ByQuery),
		b.screenshot("task-attempts", &buf))
	if !strings.Contains(stack, "goroutine") || !strings.Contains(stack, "attempts_test.go") {
		t.Fatalf("the panic's stack:\n%s", stack)
	}
}

// runAttemptsSystem runs a relay and a worker on queue for the rest of the test:
// each task's first run fails, its second panics, its third succeeds.
func runAttemptsSystem(t *testing.T, e *env, queue string) {
	t.Helper()
	rl, err := relay.New(e.pool, e.dq.AsRedis(), relay.Config{PollInterval: 50 * time.Millisecond, ReapInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w, err := clientkit.NewClient(e.pool, e.dq, e.ob, delayq.WorkerConfig{Lease: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = w.Handle(queue, func(ctx context.Context, task *delayq.Task) error {
		switch task.Attempt {
		case 1:
			return errors.New("crm: 503 <unavailable>")
		case 2:
			panic("crm: account 17 has no owner")
		}
		return nil
	}, delayq.QueueConfig{Backoff: delayq.Backoff{Base: 10 * time.Millisecond, Max: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = rl.Run(ctx) })
	wg.Go(func() { _ = w.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}
