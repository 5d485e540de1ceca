package uibrowser

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/delayq/delayq/internal/schedrun"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/schedule"
)

// TestBrowserScheduleActions: an operator pauses a schedule from the Schedules
// page and sees it paused; runs one tick now with a double click and sees the
// one task it made, then follows it to its page; resumes the schedule.
func TestBrowserScheduleActions(t *testing.T) {
	t.Parallel()
	b := newBrowser(t, 1600, 900)
	e := newEnv(t)
	// Noon in Tokyo: no tick within the runner's lookahead.
	s := schedule.Schedule{Name: "digest", Queue: "mail", Cron: "0 12 * * *", TimeZone: "Asia/Tokyo", Payload: []byte(`{"kind":"digest"}`)}
	r, err := schedrun.New(schedule.Config{Schedules: []schedule.Schedule{s}}, e.ob, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.RunOnce(context.Background(), e.pool); err != nil {
		t.Fatal(err)
	}
	// A queue for the queues page, where the login lands.
	e.enqueue(t, outbox.Task{Queue: "mail", ID: "welcome-1", Payload: []byte(`{}`), Delay: time.Hour})
	state := func() (paused bool, runs int) {
		t.Helper()
		if err := e.pool.QueryRow(ctxT(t), `SELECT paused_at IS NOT NULL,
    (SELECT count(*) FROM delayq_outbox WHERE queue = 'mail' AND task_id LIKE 'digest@run-%')
FROM delayq_schedules WHERE name = 'digest'`).Scan(&paused, &runs); err != nil {
			t.Fatal(err)
		}
		return paused, runs
	}

	_, run := b.tab(t)
	var flash, badge, lastRun, taskState string
	run(login(e),
		chromedp.Click(`nav a[href$="/schedules"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`tr[data-schedule="digest"] button.pause`, chromedp.ByQuery),
		chromedp.Click(`tr[data-schedule="digest"] button.pause`, chromedp.ByQuery),
		chromedp.WaitVisible(`p.flash`, chromedp.ByQuery),
		chromedp.Text(`p.flash`, &flash, chromedp.ByQuery),
		chromedp.Text(`tr[data-schedule="digest"] [data-paused]`, &badge, chromedp.ByQuery),
	)
	if !strings.Contains(flash, "Schedule paused") || badge != "paused" {
		t.Fatalf("after pause: flash %q, badge %q", flash, badge)
	}
	if paused, _ := state(); !paused {
		t.Fatal("the schedule is not paused in the database")
	}

	// Run now, double-clicked: one task, shown as the last manual run.
	run(chromedp.DoubleClick(`tr[data-schedule="digest"] button.run-now`, chromedp.ByQuery),
		chromedp.WaitVisible(`tr[data-schedule="digest"] a[data-last-run]`, chromedp.ByQuery),
		chromedp.Text(`p.flash`, &flash, chromedp.ByQuery),
		chromedp.Text(`tr[data-schedule="digest"] a[data-last-run]`, &lastRun, chromedp.ByQuery),
	)
	if !strings.Contains(flash, "One tick enqueued now") && !strings.Contains(flash, "sent twice") || lastRun != "pending" {
		t.Fatalf("after run now: flash %q, last run %q", flash, lastRun)
	}
	if _, runs := state(); runs != 1 {
		t.Fatalf("run now double-clicked: %d tasks, want 1", runs)
	}
	run(chromedp.Click(`tr[data-schedule="digest"] a[data-last-run]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#pg-state`, chromedp.ByQuery),
		chromedp.Text(`#pg-state`, &taskState, chromedp.ByQuery))
	if !strings.Contains(taskState, "pending") {
		t.Fatalf("the run's task page: state %q", taskState)
	}

	// Back, and resume.
	run(chromedp.Click(`nav a[href$="/schedules"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`tr[data-schedule="digest"] button.resume`, chromedp.ByQuery),
		chromedp.Click(`tr[data-schedule="digest"] button.resume`, chromedp.ByQuery),
		chromedp.WaitVisible(`tr[data-schedule="digest"] button.pause`, chromedp.ByQuery),
		chromedp.Text(`tr[data-schedule="digest"] [data-paused]`, &badge, chromedp.ByQuery))
	if badge != "running" {
		t.Fatalf("after resume: %q", badge)
	}
	if paused, runs := state(); paused || runs != 1 {
		t.Fatalf("after resume: paused %v, %d runs", paused, runs)
	}
}
