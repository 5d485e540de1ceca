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

// TestBrowserTaskActions: the actions no other browser test clicks, each from
// the page an operator would use, checked in Postgres afterwards: run a task
// now and cancel another from their pages, purge one dead task, purge and
// retry every dead task of a queue (each confirmed by typing the queue's
// name), and run a consistency check that finds the cancelled task's copy.
func TestBrowserTaskActions(t *testing.T) {
	t.Parallel()
	b := newBrowser(t, 1400, 900)
	e := newEnv(t)
	sys := e.runSystem(t, "mail")
	e.enqueue(t,
		outbox.Task{Queue: "mail", ID: "later-1", Payload: []byte(`{}`), Delay: time.Hour},
		outbox.Task{Queue: "mail", ID: "later-2", Payload: []byte(`{}`), Delay: time.Hour},
		outbox.Task{Queue: "mail", ID: "bad-1", Payload: []byte(`{"kind":"fail"}`)},
		outbox.Task{Queue: "mail", ID: "bad-2", Payload: []byte(`{"kind":"fail"}`)},
		outbox.Task{Queue: "mail", ID: "bad-3", Payload: []byte(`{"kind":"fail"}`)},
	)
	for _, id := range []string{"bad-1", "bad-2", "bad-3"} {
		e.waitState(t, "mail", id, taskstate.Dead)
	}
	_, run := b.tab(t)
	task := func(id string) string { return e.srv.URL + "/task?queue=mail&id=" + id }
	var flash string
	click := func(sel string) chromedp.Tasks {
		return chromedp.Tasks{
			chromedp.Click(sel, chromedp.ByQuery),
			chromedp.WaitVisible(`p.flash`, chromedp.ByQuery),
			chromedp.Text(`p.flash`, &flash, chromedp.ByQuery),
		}
	}

	// Run now: the task due in an hour runs at once.
	run(login(e), chromedp.Navigate(task("later-1")), click(`#run-now`))
	e.waitState(t, "mail", "later-1", taskstate.Done)

	// Cancel: the other one never runs.
	run(chromedp.Navigate(task("later-2")), click(`#cancel`))
	if r := e.row(t, "mail", "later-2"); r.State != taskstate.Cancelled {
		t.Fatalf("after cancel: %+v (flash %q)", r, flash)
	}

	// Purge one dead task from its page.
	run(chromedp.Navigate(task("bad-1")), click(`#purge`))
	if r := e.row(t, "mail", "bad-1"); r.Exists {
		t.Fatalf("after purge: %+v (flash %q)", r, flash)
	}

	// Purge every dead task of the queue: a confirmation asks for its name.
	confirmAll := func(action string) {
		t.Helper()
		run(chromedp.Navigate(e.srv.URL+"/dead?queue=mail"),
			chromedp.Click(fmt.Sprintf(`form[action$="/action/%s"] button`, action), chromedp.ByQuery),
			chromedp.WaitVisible(`#confirm`, chromedp.ByQuery),
			chromedp.SendKeys(`#confirm`, "mail", chromedp.ByQuery),
			click(`#confirm-submit`))
	}
	confirmAll("purge-all")
	for _, id := range []string{"bad-2", "bad-3"} {
		if r := e.row(t, "mail", id); r.Exists {
			t.Fatalf("after purge all: %s is %+v (flash %q)", id, r, flash)
		}
	}

	// Retry every dead task of the queue, once the handler is fixed: they run.
	e.enqueue(t,
		outbox.Task{Queue: "mail", ID: "bad-4", Payload: []byte(`{"kind":"fail"}`)},
		outbox.Task{Queue: "mail", ID: "bad-5", Payload: []byte(`{"kind":"fail"}`)},
	)
	e.waitState(t, "mail", "bad-4", taskstate.Dead)
	e.waitState(t, "mail", "bad-5", taskstate.Dead)
	sys.fixed.Store(true)
	confirmAll("retry-all")
	e.waitState(t, "mail", "bad-4", taskstate.Done)
	e.waitState(t, "mail", "bad-5", taskstate.Done)

	// A consistency check finds the one divergence left: the cancelled task's
	// copy, still in Redis (a cancel writes Postgres; the copy is dropped by
	// the claim's guard or by reconcile).
	var found, kinds string
	run(chromedp.Navigate(e.srv.URL+"/consistency"),
		chromedp.Click(`#check`, chromedp.ByQuery),
		chromedp.WaitVisible(`#found`, chromedp.ByQuery),
		chromedp.Text(`#found`, &found, chromedp.ByQuery),
		chromedp.Text(`#kinds`, &kinds, chromedp.ByQuery))
	if found != "1" || !strings.Contains(kinds, "finished_in_postgres\t1") || !strings.Contains(kinds, "mail/later-2") {
		t.Fatalf("the check found %q divergences, want the cancelled task's copy alone:\n%s", found, kinds)
	}
}
