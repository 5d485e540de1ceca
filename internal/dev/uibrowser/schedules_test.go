package uibrowser

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/schedule"
)

// TestBrowserSchedules: an operator finds from the nav which schedules fire
// next (in their zone and in UTC) and whether the last tick ran, then follows
// the last tick's task to its page. Screenshot "schedules".
func TestBrowserSchedules(t *testing.T) {
	t.Parallel()
	b := newBrowser(t, 1720, 900) // the whole table, actions to "seen"
	e := newEnv(t)
	last := time.Date(2026, 12, 4, 7, 0, 0, 0, time.UTC) // 08:00 in Berlin
	id := schedule.TaskID(schedule.Schedule{Name: "daily-digest"}, last)
	e.enqueue(t, outbox.Task{Queue: "digest", ID: id, Payload: []byte(`{}`), Delay: time.Hour})
	if ok, err := e.store.RecordFailure(ctxT(t), e.pool, taskstate.Failure{
		Key: taskstate.Key{Queue: "digest", ID: id, Version: 1}, Attempt: 1, Err: "smtp: connection refused", Dead: true}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, err := e.pool.Exec(ctxT(t), `INSERT INTO delayq_schedules (name, queue, spec, time_zone, last_tick, last_enqueued, next_tick, enqueued, missed)
VALUES ('daily-digest', 'digest', 'cron 0 8 * * * (Europe/Berlin)', 'Europe/Berlin', $1, $1, $1::timestamptz + interval '1 day', 12, 0),
       ('heartbeat', 'ops', 'every 30s', 'UTC', now(), NULL, now() + interval '30 seconds', 0, 1)`, last); err != nil {
		t.Fatal(err)
	}

	_, run := b.tab(t)
	var buf []byte
	var title, next, outcome, lastNone, state string
	var rows int
	run(login(e), // logged in: the screenshot shows the actions
		chromedp.Click(`nav a[href$="/schedules"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#schedules`, chromedp.ByQuery),
		chromedp.Text(`main h1`, &title, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('#schedules tr[data-schedule]').length`, &rows),
		chromedp.Text(`tr[data-schedule="daily-digest"] td:nth-child(4)`, &next, chromedp.ByQuery),
		chromedp.Text(`tr[data-schedule="daily-digest"] [data-last-task]`, &outcome, chromedp.ByQuery),
		chromedp.Text(`tr[data-schedule="heartbeat"] [data-last]`, &lastNone, chromedp.ByQuery),
		b.screenshot("schedules", &buf),
	)
	if title != "Schedules" || rows != 2 || next != "2026-12-05 08:00:00 CET" || outcome != "dead" || lastNone != "none yet" {
		t.Fatalf("schedules page: title %q, %d rows, next %q, last tick's task %q, heartbeat's last %q", title, rows, next, outcome, lastNone)
	}
	// Why did it not run? The last tick's task, one click away.
	run(chromedp.Click(`tr[data-schedule="daily-digest"] [data-last-task]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#pg-state`, chromedp.ByQuery),
		chromedp.Text(`#pg-state`, &state, chromedp.ByQuery))
	if !strings.Contains(state, "dead") {
		t.Fatalf("the last tick's task page: state %q, want dead", state)
	}
}
