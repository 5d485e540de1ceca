package ui

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/schedule"
)

// TestSchedulesPage: the nav links the page; a schedule a worker runs is listed
// with its timing, its next tick in its own zone and in UTC, and no last tick
// before the first; a schedule whose last tick's task died shows the tick and
// that task's outcome, linked to its page, its error's text escaped.
func TestSchedulesPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	c := e.client(t)
	if _, body := c.get("/schedules"); !strings.Contains(body, `id="no-schedules"`) {
		t.Fatalf("no schedule yet:\n%s", body)
	}
	if _, body := c.get("/"); !strings.Contains(body, `href="/schedules">Schedules</a>`) {
		t.Error("the nav does not link the schedules page")
	}

	// A worker's client runs a schedule declared in Go: its row appears.
	w, err := clientkit.NewClient(e.pool, e.dq, e.ob, delayq.WorkerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Schedule(schedule.Schedule{Name: "nightly", Queue: "reports", Cron: "0 3 * * *", TimeZone: "Europe/Paris", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = w.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	var body string
	for deadline := time.Now().Add(20 * time.Second); ; {
		if _, body = c.get("/schedules"); strings.Contains(body, `data-schedule="nightly"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker's schedule is not listed:\n%s", body)
		}
		time.Sleep(50 * time.Millisecond) // polling the page under test
	}
	paris, _ := time.LoadLocation("Europe/Paris")
	next := schedule.Schedule{Name: "nightly", Queue: "reports", Cron: "0 3 * * *", TimeZone: "Europe/Paris"}
	tick, err := schedule.Next(next, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		tick.In(paris).Format("2006-01-02 15:04:05 MST"), // 03:00 in Paris
		tick.UTC().Format("2006-01-02 15:04:05"),         // and in UTC
		`cron 0 3 * * * (Europe/Paris)`,
		`data-last="none"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the schedules page lacks %q:\n%s", want, body)
		}
	}

	// A schedule whose last tick's task died: the tick, and the task's outcome.
	last := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	id := schedule.TaskID(schedule.Schedule{Name: "digest"}, last)
	e.enqueue(t, outbox.Task{Queue: "mail", ID: id, Payload: []byte(`{}`), Delay: time.Hour})
	e.kill(t, "mail", id, `<b>smtp refused</b>`)
	if _, err := e.pool.Exec(ctxT(t), `INSERT INTO delayq_schedules (name, queue, spec, time_zone, last_tick, last_enqueued, next_tick, enqueued, missed)
VALUES ('digest', 'mail', 'cron 0 8 * * *', 'UTC', $1, $1, $1::timestamptz + interval '1 day', 3, 2)`, last); err != nil {
		t.Fatal(err)
	}
	_, body = c.get("/schedules")
	for _, want := range []string{
		// The id's '@' escaped once: the link reaches the task (a tick's id
		// was escaped twice, %2540, in every page's links).
		`data-last-task="dead" href="/task?queue=mail&amp;id=digest%4020261130T080000Z"`,
		`title="&lt;b&gt;smtp refused&lt;/b&gt;"`,
		last.Format("2006-01-02 15:04:05"),
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the schedules page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "<b>smtp") {
		t.Error("an error's text is not escaped")
	}
	if resp, page := c.get("/task?queue=mail&id=digest%4020261130T080000Z"); resp.StatusCode != 200 || !strings.Contains(page, "smtp refused") {
		t.Errorf("the last tick's task page: %d\n%s", resp.StatusCode, page)
	}
}
