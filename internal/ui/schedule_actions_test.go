package ui

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/schedrun"
	"github.com/delayq/delayq/internal/schedspec"
	"github.com/delayq/delayq/schedule"
)

// runSchedule has a runner evaluate s once, as a relay or worker does: its row
// and its payload are then in the database.
func (e *env) runSchedule(t *testing.T, s schedule.Schedule) {
	t.Helper()
	r, err := schedrun.New(schedule.Config{Schedules: []schedule.Schedule{s}}, e.ob, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.RunOnce(context.Background(), e.pool); err != nil {
		t.Fatal(err)
	}
}

// scheduleState reads a schedule's pause and its count of tasks in queue.
func (e *env) scheduleState(t *testing.T, name, queue string) (paused bool, tasks int) {
	t.Helper()
	if err := e.pool.QueryRow(ctxT(t), `SELECT paused_at IS NOT NULL, (SELECT count(*) FROM delayq_outbox WHERE queue = $2)
FROM delayq_schedules WHERE name = $1`, name, queue).Scan(&paused, &tasks); err != nil {
		t.Fatal(err)
	}
	return paused, tasks
}

var runKeyRE = regexp.MustCompile(`name="run" value="([^"]+)"`)

// TestScheduleActions: pause and resume a schedule and run one tick now from the
// schedules page; the run-now form sent twice is one task, shown as the last
// manual run and linked; refused without the CSRF token, for an unknown
// schedule and for a stale page, each changing nothing.
func TestScheduleActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	// Every day at noon in Tokyo: no tick within the lookahead (03:00 UTC).
	e.runSchedule(t, schedule.Schedule{Name: "digest", Queue: "mail", Cron: "0 12 * * *", TimeZone: "Asia/Tokyo", Payload: []byte(`{"d":1}`)})
	_, tasks := e.scheduleState(t, "digest", "mail")
	c := e.client(t)
	if _, body := c.get("/schedules"); strings.Contains(body, "/action/") {
		t.Errorf("actions shown to an anonymous visitor:\n%s", body)
	}
	c.login()
	_, body := c.get("/schedules")
	for _, want := range []string{`data-paused="false"`, `action="/action/schedule-pause"`, `action="/action/schedule-run"`,
		`name="schedule" value="digest"`, `data-last-run="none"`} {
		if !strings.Contains(body, want) {
			t.Errorf("the schedules page lacks %q:\n%s", want, body)
		}
	}

	// Refused: no CSRF token, a wrong one; an unknown schedule; a stale form.
	for _, action := range []string{"schedule-pause", "schedule-resume", "schedule-run"} {
		form := url.Values{"schedule": {"digest"}, "run": {schedspec.NewRunKey(time.Now())}}
		if resp, _ := c.post("/action/"+action, form); resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s without a CSRF token: %s", action, resp.Status)
		}
		form.Set("csrf", strings.Repeat("0", 64))
		if resp, _ := c.post("/action/"+action, form); resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s with a wrong CSRF token: %s", action, resp.Status)
		}
		form.Set("csrf", c.csrf("/consistency"))
		form.Set("schedule", "nope")
		if resp, body := c.post("/action/"+action, form); resp.StatusCode != http.StatusNotFound || !strings.Contains(body, `schedule &#34;nope&#34;: no such schedule`) {
			t.Errorf("%s of an unknown schedule: %s\n%s", action, resp.Status, body)
		}
	}
	stale := url.Values{"schedule": {"digest"}, "run": {schedspec.NewRunKey(time.Now().Add(-time.Hour))}, "csrf": {c.csrf("/consistency")}}
	if resp, body := c.post("/action/schedule-run", stale); resp.StatusCode != http.StatusConflict || !strings.Contains(body, "reload it") {
		t.Errorf("a stale run-now form: %s\n%s", resp.Status, body)
	}
	if paused, n := e.scheduleState(t, "digest", "mail"); paused || n != tasks {
		t.Fatalf("refused actions changed the schedule: paused %v, %d tasks (were %d)", paused, n, tasks)
	}

	// Pause, then resume.
	if to := c.act("schedule-pause", url.Values{"schedule": {"digest"}}); !strings.Contains(to, "ok=schedule-paused") {
		t.Errorf("pause redirects to %q", to)
	}
	_, body = c.get("/schedules?ok=schedule-paused")
	if !strings.Contains(body, `data-paused="true"`) || !strings.Contains(body, `action="/action/schedule-resume"`) || !strings.Contains(body, "Schedule paused") {
		t.Errorf("the paused schedule is not shown paused:\n%s", body)
	}
	if paused, _ := e.scheduleState(t, "digest", "mail"); !paused {
		t.Fatal("not paused in the database")
	}
	c.act("schedule-resume", url.Values{"schedule": {"digest"}})
	if paused, _ := e.scheduleState(t, "digest", "mail"); paused {
		t.Fatal("still paused")
	}

	// Run now, the form sent twice: one task, the last manual run.
	_, body = c.get("/schedules")
	m := runKeyRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no run key on the page:\n%s", body)
	}
	form := url.Values{"schedule": {"digest"}, "run": {m[1]}}
	if to := c.act("schedule-run", form); !strings.Contains(to, "ok=schedule-run") {
		t.Errorf("run now redirects to %q", to)
	}
	if to := c.act("schedule-run", form); !strings.Contains(to, "ok=schedule-run-dup") {
		t.Errorf("run now sent twice redirects to %q", to)
	}
	if _, n := e.scheduleState(t, "digest", "mail"); n != tasks+1 {
		t.Fatalf("run now twice: %d tasks, want %d", n, tasks+1)
	}
	id := schedspec.RunID("digest", m[1])
	_, body = c.get("/schedules?ok=schedule-run-dup")
	link := `data-last-run="pending" href="/task?queue=mail&amp;id=` + url.QueryEscape(id) + `"`
	if !strings.Contains(body, link) || !strings.Contains(body, "sent twice") {
		t.Errorf("the schedules page lacks the run's task %q:\n%s", link, body)
	}
	if resp, page := c.get("/task?queue=mail&id=" + url.QueryEscape(id)); resp.StatusCode != 200 || !strings.Contains(page, "&#34;d&#34;") {
		t.Errorf("the run's task page: %s\n%s", resp.Status, page)
	}
}

// TestScheduleActionsReadOnly: read-only, the schedules page has no action and
// the actions do not exist; nothing changes.
func TestScheduleActionsReadOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.Token, c.ReadOnly = "", true })
	e.runSchedule(t, schedule.Schedule{Name: "digest", Queue: "mail", Cron: "0 12 * * *", TimeZone: "Asia/Tokyo"})
	_, tasks := e.scheduleState(t, "digest", "mail")
	c := e.client(t)
	_, body := c.get("/schedules")
	if !strings.Contains(body, `data-schedule="digest"`) || strings.Contains(body, "/action/") || strings.Contains(body, `name="run"`) {
		t.Errorf("read-only schedules page:\n%s", body)
	}
	for _, action := range []string{"schedule-pause", "schedule-resume", "schedule-run"} {
		form := url.Values{"schedule": {"digest"}, "run": {schedspec.NewRunKey(time.Now())}}
		if resp, _ := c.post("/action/"+action, form); resp.StatusCode != http.StatusMethodNotAllowed && resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s in read-only mode: %s", action, resp.Status)
		}
	}
	if paused, n := e.scheduleState(t, "digest", "mail"); paused || n != tasks {
		t.Fatalf("read-only mode changed the schedule: paused %v, %d tasks (were %d)", paused, n, tasks)
	}
}

// TestSchedulePauseDeclared: with the serving process's schedules (the
// dashboard of a client), one declared and never run is listed and paused
// before its first tick: its row is registered paused, and its first runner
// enqueues nothing.
func TestSchedulePauseDeclared(t *testing.T) {
	t.Parallel()
	s := schedule.Schedule{Name: "soon", Queue: "ops", Every: time.Second, Payload: []byte(`{}`)}
	var w *delayq.Client
	e := newEnv(t, func(c *Config) {
		var err error
		if w, err = clientkit.NewClient(c.DB.(*pgxpool.Pool), c.Redis, c.Outbox, delayq.WorkerConfig{}); err != nil {
			t.Fatal(err)
		}
		if err := w.Schedule(s); err != nil {
			t.Fatal(err)
		}
		c.Schedules = w.Schedules
	})
	c := e.client(t)
	c.login()
	_, body := c.get("/schedules")
	if !strings.Contains(body, `data-schedule="soon"`) || !strings.Contains(body, "declared, not run yet") || strings.Contains(body, `name="run"`) {
		t.Fatalf("the declared schedule, with pause and without run now:\n%s", body)
	}
	c.act("schedule-pause", url.Values{"schedule": {"soon"}})
	if paused, _ := e.scheduleState(t, "soon", "ops"); !paused {
		t.Fatal("not registered paused")
	}
	e.runSchedule(t, s)
	if paused, n := e.scheduleState(t, "soon", "ops"); !paused || n != 0 {
		t.Fatalf("its first runner: paused %v, %d tasks", paused, n)
	}
	_, body = c.get("/schedules")
	if !strings.Contains(body, `data-paused="true"`) {
		t.Errorf("not shown paused:\n%s", body)
	}
}
