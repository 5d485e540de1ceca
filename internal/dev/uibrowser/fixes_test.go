package uibrowser

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
)

// TestBrowserFixes drives the faults of issue 32 an operator met, each fixed: an
// invalid edit kept with its error, a done task's outcome, a queue without rows
// paused, the sorts and the search by payload, and every page at 420 px wide
// without the page scrolling sideways. A browser of its own, one tab at a time.
func TestBrowserFixes(t *testing.T) {
	t.Parallel()
	b := newBrowser(t, 1400, 900)
	t.Run("an invalid edit keeps the text", func(t *testing.T) { b.editRefused(t) })
	t.Run("a done task shows its outcome", func(t *testing.T) { b.doneOutcome(t) })
	t.Run("a queue without rows is paused", func(t *testing.T) { b.pauseEmptyQueue(t) })
	t.Run("sort and search", func(t *testing.T) { b.sortAndSearch(t) })
	narrow := newBrowser(t, 420, 860)
	t.Run("every page at 420 px", func(t *testing.T) { narrow.narrow(t) })
}

// An operator's invalid JSON edit comes back on the task's page, the text as
// typed and the error beside it; corrected, it retries.
func (b *browser) editRefused(t *testing.T) {
	e := newEnv(t)
	e.enqueue(t, outbox.Task{Queue: "mail", ID: "invite-9", Payload: []byte(`{"to":"bob@example","template":"invite"}`), Delay: time.Hour})
	if ok, err := e.store.RecordFailure(ctxT(t), e.pool, taskstate.Failure{
		Key: taskstate.Key{Queue: "mail", ID: "invite-9", Version: 1}, Attempt: 1, Err: "no such domain", Dead: true}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	_, run := b.tab(t)
	typed := "{\n  \"to\": \"bob@example.com\",\n  \"template\": \"invite\",\n}"
	var buf []byte
	var errText, kept string
	run(login(e),
		chromedp.Navigate(e.srv.URL+"/task?queue=mail&id=invite-9"),
		chromedp.WaitVisible(`#edit-payload`, chromedp.ByQuery),
		chromedp.SetValue(`#edit-payload`, typed, chromedp.ByQuery),
		chromedp.Click(`#edit-retry`, chromedp.ByQuery),
		chromedp.WaitVisible(`#edit-error`, chromedp.ByQuery),
		chromedp.Text(`#edit-error`, &errText, chromedp.ByQuery),
		chromedp.Value(`#edit-payload`, &kept, chromedp.ByQuery),
		b.screenshot("edit-error", &buf),
	)
	if !strings.Contains(errText, "not") || kept != typed {
		t.Fatalf("error %q, edit box %q, want the text as typed", errText, kept)
	}
	var flash string
	run(chromedp.SetValue(`#edit-payload`, strings.Replace(typed, "\"invite\",\n", "\"invite\"\n", 1), chromedp.ByQuery),
		chromedp.Click(`#edit-retry`, chromedp.ByQuery),
		chromedp.WaitVisible(`p.flash`, chromedp.ByQuery),
		chromedp.Text(`p.flash`, &flash, chromedp.ByQuery))
	if !strings.Contains(flash, "edited payload") {
		t.Fatalf("after the correction: %q", flash)
	}
}

// A task that failed once and then succeeded shows done, when, and the earlier
// error as history, not as its state.
func (b *browser) doneOutcome(t *testing.T) {
	e := newEnv(t)
	sys := e.runSystem(t, "mail")
	e.enqueue(t, outbox.Task{Queue: "mail", ID: "receipt-3", Payload: []byte(`{"order_id":3,"kind":"fail"}`)})
	e.waitState(t, "mail", "receipt-3", taskstate.Dead)
	sys.fixed.Store(true)
	c := e.client(t)
	c.get("/") // the first request of this env: warm
	_, run := b.tab(t)
	run(login(e),
		chromedp.Navigate(e.srv.URL+"/task?queue=mail&id=receipt-3"),
		chromedp.WaitVisible(`#retry`, chromedp.ByQuery),
		chromedp.Click(`#retry`, chromedp.ByQuery),
		chromedp.WaitVisible(`p.flash`, chromedp.ByQuery))
	e.waitState(t, "mail", "receipt-3", taskstate.Done)
	var buf []byte
	var outcome, released string
	var missingBadge, redErr bool
	run(chromedp.Navigate(e.srv.URL+"/task?queue=mail&id=receipt-3"),
		chromedp.WaitVisible(`#pg-outcome`, chromedp.ByQuery),
		chromedp.Text(`#pg-outcome`, &outcome, chromedp.ByQuery),
		chromedp.Text(`#redis-released`, &released, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelector('.r-missing') !== null`, &missingBadge),
		chromedp.Evaluate(`document.querySelector('#postgres dd.err') !== null`, &redErr),
		b.screenshot("task-done", &buf))
	if !strings.HasPrefix(outcome, "done") || !strings.Contains(released, "leaves Redis") || missingBadge || redErr {
		t.Fatalf("outcome %q, Redis %q, missing badge %v, red error %v", outcome, released, missingBadge, redErr)
	}
}

// A queue a worker serves, with no task yet, is on the queues page and pauses.
func (b *browser) pauseEmptyQueue(t *testing.T) {
	e := newEnv(t)
	e.runSystem(t, "invoices") // registers the queue; no task is enqueued
	_, run := b.tab(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body := e.client(t).get("/")
		if strings.Contains(body, `data-queue="invoices"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker's queue never listed:\n%s", body)
		}
		time.Sleep(20 * time.Millisecond) // polling the page: no signal to wait on from outside
	}
	var badge string
	run(login(e),
		chromedp.Click(`tr[data-queue="invoices"] button.pause`, chromedp.ByQuery),
		chromedp.WaitVisible(`p.flash`, chromedp.ByQuery),
		chromedp.Text(`tr[data-queue="invoices"] [data-paused]`, &badge, chromedp.ByQuery))
	if badge != "paused" {
		t.Fatalf("badge %q", badge)
	}
	if p, err := e.redisPaused(t, "invoices"); err != nil || !p {
		t.Fatalf("Redis: paused %v %v", p, err)
	}
}

// The operator sorts a queue's tasks by creation time and finds one by a field
// of its payload, from the form.
func (b *browser) sortAndSearch(t *testing.T) {
	e := newEnv(t)
	for i := 1; i <= 12; i++ {
		e.enqueue(t, outbox.Task{Queue: "orders", ID: fmt.Sprintf("ord-%d", i),
			Payload: []byte(fmt.Sprintf(`{"order_id":%d,"customer":{"email":"c%d@example.com"}}`, i, i%5)), Delay: time.Duration(i) * time.Hour})
	}
	_, run := b.tab(t)
	var first, note string
	var rows int
	var buf []byte
	run(chromedp.Navigate(e.srv.URL+"/tasks?queue=orders"),
		chromedp.WaitVisible(`#sort`, chromedp.ByQuery),
		chromedp.SetValue(`#sort`, "created", chromedp.ByQuery),
		chromedp.Submit(`#sort`, chromedp.ByQuery),
		chromedp.WaitVisible(`table#tasks`, chromedp.ByQuery),
		chromedp.Text(`table#tasks tbody tr a.task`, &first, chromedp.ByQuery))
	if first != "ord-12" {
		t.Fatalf("sorted by creation, first %q", first)
	}
	run(chromedp.SetValue(`#sort`, "", chromedp.ByQuery),
		chromedp.SendKeys(`#search-path`, "customer.email", chromedp.ByQuery),
		chromedp.SendKeys(`#search-value`, "c2@example.com", chromedp.ByQuery),
		chromedp.Submit(`#search-path`, chromedp.ByQuery),
		chromedp.WaitVisible(`#search-note`, chromedp.ByQuery),
		chromedp.Text(`#search-note`, &note, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('table#tasks tbody tr').length`, &rows),
		b.screenshot("tasks-search", &buf))
	if rows != 3 || !strings.Contains(note, "Searched 12 rows") { // ord-2, ord-7, ord-12
		t.Fatalf("search: %d rows, note %q", rows, note)
	}
}

// At 420 px no page scrolls sideways (a wide table scrolls in its own box), and
// the login button stands in line with the token's field.
func (b *browser) narrow(t *testing.T) {
	e := newEnv(t)
	e.enqueue(t, outbox.Task{Queue: "notifications-eu-west", ID: "push-000000000001", Payload: []byte(`{"user_id":123456789,"text":"a long payload line that must wrap rather than widen the page"}`), Delay: time.Hour})
	_, run := b.tab(t)
	var inputBottom, buttonBottom float64
	run(chromedp.EmulateViewport(420, 860), // each tab its own: a window is never narrower than 500 px
		chromedp.Navigate(e.srv.URL+"/login"),
		chromedp.WaitVisible(`#token`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelector('#token').getBoundingClientRect().bottom`, &inputBottom),
		chromedp.Evaluate(`document.querySelector('#login-submit').getBoundingClientRect().bottom`, &buttonBottom))
	if d := inputBottom - buttonBottom; d > 2 || d < -2 {
		t.Errorf("login: the field ends at %.1f px, the button at %.1f", inputBottom, buttonBottom)
	}
	run(login(e))
	var buf []byte
	for _, p := range []struct{ name, path string }{
		{"queues", "/"}, {"tasks", "/tasks?queue=notifications-eu-west"},
		{"task", "/task?queue=notifications-eu-west&id=push-000000000001"}, {"dead", "/dead"}, {"consistency", "/consistency"},
	} {
		var width, inner int
		run(chromedp.Navigate(e.srv.URL+p.path),
			chromedp.WaitVisible(`main h1`, chromedp.ByQuery),
			chromedp.Evaluate(`document.documentElement.scrollWidth`, &width),
			chromedp.Evaluate(`window.innerWidth`, &inner))
		if inner != 420 || width > inner {
			t.Errorf("%s at %d px: the page is %d px wide", p.name, inner, width)
		}
		if p.name == "queues" {
			run(b.screenshot("narrow-queues", &buf))
		}
	}
}
