package ui

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// bulk posts a bulk form (preview: /action/bulk, confirmation: bulk-run) with
// the CSRF token and returns the status and the page.
func (c *client) bulk(action string, form url.Values) (int, string) {
	c.t.Helper()
	form.Set("csrf", c.csrf("/consistency"))
	resp, body := c.post("/action/"+action, form)
	return resp.StatusCode, body
}

// count reads the number in the element of id on a page.
func count(t *testing.T, body, id string) int {
	t.Helper()
	m := regexp.MustCompile(`id="` + id + `">(\d+)<`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no %s on the page:\n%s", id, body)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// previewThenRun previews form, checks the counts to act on and to skip, then
// confirms with the count previewed and returns the result page.
func (c *client) previewThenRun(form url.Values, act, skip int) string {
	c.t.Helper()
	code, body := c.bulk("bulk", form)
	if code != http.StatusOK {
		c.t.Fatalf("preview %v: %d\n%s", form, code, body)
	}
	if a, s := count(c.t, body, "act-count"), count(c.t, body, "skip-count"); a != act || s != skip {
		c.t.Fatalf("preview %v: %d to act on, %d skipped; want %d and %d\n%s", form, a, s, act, skip, body)
	}
	form.Set("expect", strconv.Itoa(act))
	code, body = c.bulk("bulk-run", form)
	if code != http.StatusOK {
		c.t.Fatalf("run %v: %d\n%s", form, code, body)
	}
	return body
}

func (e *env) states(t *testing.T, queue string, ids ...string) map[string]taskstate.RowState {
	t.Helper()
	out := map[string]taskstate.RowState{}
	for _, id := range ids {
		out[id] = e.row(t, queue, id)
	}
	return out
}

// runRelay moves the outbox's rows to Redis for the rest of the test.
func (e *env) runRelay(t *testing.T) {
	t.Helper()
	rl, err := relay.New(e.pool, e.dq.AsRedis(), relay.Config{PollInterval: 20 * time.Millisecond, Horizon: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = rl.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

// waitState waits until the row of queue/id is in state.
func (e *env) waitState(t *testing.T, queue, id string, state taskstate.State) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if e.row(t, queue, id).State == state {
			return
		}
	}
	t.Fatalf("%s/%s: %+v, want %s", queue, id, e.row(t, queue, id), state)
}

// waitRedis waits until Redis holds queue/id as want says.
func (e *env) waitRedis(t *testing.T, queue, id string, want func(dispatch.TaskInfo) bool) dispatch.TaskInfo {
	t.Helper()
	var info dispatch.TaskInfo
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		infos, err := e.dq.Inspect(ctxT(t), queue, id)
		if err != nil {
			t.Fatal(err)
		}
		if info = infos[0]; want(info) {
			return info
		}
	}
	t.Fatalf("%s/%s in Redis: %+v", queue, id, info)
	return info
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return out
}

func tasks(queue string, delay time.Duration, payload string, ids ...string) []outbox.Task {
	out := make([]outbox.Task, len(ids))
	for i, id := range ids {
		out[i] = outbox.Task{Queue: queue, ID: id, Payload: []byte(payload), Delay: delay}
	}
	return out
}

func TestBulkByTicks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue(t, tasks("mail", time.Hour, `{}`, "a", "b", "c", "d")...)
	e.enqueue(t, tasks("sms", time.Hour, `{}`, "x", "y")...)
	e.kill(t, "mail", "d", "boom")
	e.kill(t, "sms", "y", "boom")
	c := e.client(t)
	c.login()
	// The list ticks each row into the bulk form.
	_, page := c.get("/tasks?queue=mail")
	if !strings.Contains(page, `id="bulk"`) || !strings.Contains(page, `name="sel" value="mail a" form="bulk"`) {
		t.Fatalf("no bulk form or ticks on the list:\n%s", page)
	}
	// Cancel a, b, x and the dead d: d is skipped and counted.
	form := url.Values{"action": {"cancel"}, "scope": {"ticked"}, "sel": {"mail a", "mail b", "sms x", "mail d", "mail gone"}}
	_, preview := c.bulk("bulk", form)
	for _, want := range []string{"dead: only a pending or queued task can be cancelled", "gone: no such task"} {
		if !strings.Contains(preview, want) {
			t.Errorf("preview does not say %q:\n%s", want, preview)
		}
	}
	if !regexp.MustCompile(`<td>mail</td><td class="n">2</td><td class="n">1</td>`).MatchString(preview) ||
		!regexp.MustCompile(`<td>sms</td><td class="n">1</td><td class="n">0</td>`).MatchString(preview) {
		t.Errorf("preview by queue:\n%s", preview)
	}
	if !regexp.MustCompile(`<span class="state dead">dead</span></td><td class="n">0</td><td class="n">1</td>`).MatchString(preview) ||
		!regexp.MustCompile(`<span class="state pending">pending</span></td><td class="n">3</td><td class="n">0</td>`).MatchString(preview) {
		t.Errorf("preview by state:\n%s", preview)
	}
	if e.row(t, "mail", "a").State != taskstate.Pending {
		t.Fatal("the preview changed a task")
	}
	res := c.previewThenRun(form, 3, 2)
	if count(t, res, "done-count") != 3 || count(t, res, "skipped-count") != 2 || count(t, res, "failed-count") != 0 {
		t.Errorf("result:\n%s", res)
	}
	for q, want := range map[string]map[string]taskstate.State{
		"mail": {"a": taskstate.Cancelled, "b": taskstate.Cancelled, "c": taskstate.Pending, "d": taskstate.Dead},
		"sms":  {"x": taskstate.Cancelled, "y": taskstate.Dead},
	} {
		for id, st := range want {
			if r := e.row(t, q, id); r.State != st {
				t.Errorf("%s/%s: %s, want %s", q, id, r.State, st)
			}
		}
	}
	// Retry and purge the dead ones by ticks; run now and reschedule the rest.
	c.previewThenRun(url.Values{"action": {"retry"}, "scope": {"ticked"}, "sel": {"mail d", "mail c"}}, 1, 1)
	c.previewThenRun(url.Values{"action": {"purge"}, "scope": {"ticked"}, "sel": {"sms y", "sms x"}}, 1, 1)
	if _, body := c.bulk("bulk", url.Values{"action": {"reschedule"}, "when": {"2030-01-02 03:04"}, "scope": {"ticked"}, "sel": {"mail c"}}); !strings.Contains(body, `<span id="at">2030-01-02 03:04:00.000Z</span>`) {
		t.Errorf("the preview of a reschedule does not say when:\n%s", body)
	}
	c.previewThenRun(url.Values{"action": {"reschedule"}, "when": {"3h"}, "scope": {"ticked"}, "sel": {"mail c"}}, 1, 0)
	if r := e.row(t, "mail", "d"); r.State != taskstate.Pending || r.Version != 2 {
		t.Errorf("retried d: %+v", r)
	}
	if r := e.row(t, "sms", "y"); r.Exists {
		t.Errorf("purged y: %+v", r)
	}
	row, _, err := e.h.browse.Task(ctxT(t), e.pool, "mail", "c", 0)
	if err != nil || row.Version != 2 || time.Until(row.RunAt) < 3*time.Hour-time.Minute {
		t.Errorf("rescheduled c: v%d due %v (%v)", row.Version, row.RunAt, err)
	}
	c.previewThenRun(url.Values{"action": {"run-now"}, "scope": {"ticked"}, "sel": {"mail c"}}, 1, 0)
	if row, _, _ := e.h.browse.Task(ctxT(t), e.pool, "mail", "c", 0); row.Version != 3 || row.RunAt.After(time.Now()) {
		t.Errorf("run now c: v%d due %v", row.Version, row.RunAt)
	}
}

// TestBulkByFilter runs each action on every task matching a filter, with the
// relay running, and checks the rows and what Redis holds afterwards.
func TestBulkByFilter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.runRelay(t)
	e.enqueue(t, tasks("can", time.Hour, `{}`, ids("c", 12)...)...)
	e.enqueue(t, tasks("now", time.Hour, `{}`, ids("n", 7)...)...)
	e.enqueue(t, tasks("later", time.Hour, `{}`, ids("l", 6)...)...)
	e.enqueue(t, tasks("dead", time.Hour, `{}`, ids("d", 8)...)...)
	e.waitRedis(t, "dead", "d07", func(i dispatch.TaskInfo) bool { return i.State == dispatch.StateReady })
	for _, id := range ids("d", 8) {
		e.kill(t, "dead", id, "boom")
	}
	for _, id := range ids("n", 7) {
		e.waitState(t, "now", id, taskstate.Queued)
	}
	c := e.client(t)
	c.login()

	// Cancel every task of a queue (any state): a done one is skipped.
	done, err := e.store.MarkDone(ctxT(t), e.pool, taskstate.Key{Queue: "can", ID: "c00", Version: 1}, false)
	if err != nil || !done {
		t.Fatalf("mark done: %v %v", done, err)
	}
	res := c.previewThenRun(url.Values{"action": {"cancel"}, "scope": {"filter"}, "queue": {"can"}}, 11, 1)
	if count(t, res, "done-count") != 11 || !strings.Contains(res, "done: only a pending or queued task can be cancelled") {
		t.Errorf("cancel result:\n%s", res)
	}
	for id, r := range e.states(t, "can", ids("c", 12)...) {
		if want := taskstate.Cancelled; id != "c00" && r.State != want || id == "c00" && r.State != taskstate.Done {
			t.Errorf("can/%s: %s", id, r.State)
		}
	}

	// Run now and reschedule: new versions, which the relay moves to Redis.
	c.previewThenRun(url.Values{"action": {"run-now"}, "scope": {"filter"}, "queue": {"now"}, "state": {"queued"}}, 7, 0)
	c.previewThenRun(url.Values{"action": {"reschedule"}, "when": {"2h"}, "scope": {"filter"}, "queue": {"later"}, "prefix": {"l0"}}, 6, 0)
	for _, id := range ids("n", 7) {
		if r := e.row(t, "now", id); r.Version != 2 {
			t.Errorf("now/%s: %+v", id, r)
		}
		e.waitRedis(t, "now", id, func(i dispatch.TaskInfo) bool { return i.Version == 2 && i.State == dispatch.StateReady })
	}
	for _, id := range ids("l", 6) {
		info := e.waitRedis(t, "later", id, func(i dispatch.TaskInfo) bool { return i.Version == 2 })
		if time.Until(info.Score) < 2*time.Hour-time.Minute {
			t.Errorf("later/%s due %v in Redis", id, info.Score)
		}
	}

	// Retry half the dead letters (a due window), purge the rest from both stores.
	mid := time.Now().Add(time.Hour).Add(time.Minute).UTC().Format("2006-01-02 15:04:05")
	_, dead := c.get("/dead?queue=dead")
	if !strings.Contains(dead, `value="retry"`) || strings.Contains(dead, `value="cancel"`) {
		t.Errorf("the dead letters offer other actions than retry and purge:\n%s", dead)
	}
	c.previewThenRun(url.Values{"action": {"retry"}, "scope": {"filter"}, "kind": {"dead"}, "queue": {"dead"}, "prefix": {"d0"}, "to": {mid}}, 8, 0)
	for _, id := range ids("d", 4) {
		c.previewThenRun(url.Values{"action": {"cancel"}, "scope": {"ticked"}, "sel": {"dead " + id}}, 1, 0)
	}
	// Now 4 cancelled, 4 pending: cancel them, kill them, purge the dead ones.
	for _, id := range ids("d", 8)[4:] {
		e.waitRedis(t, "dead", id, func(i dispatch.TaskInfo) bool { return i.Version == 2 })
		if _, err := e.store.RecordFailure(ctxT(t), e.pool, taskstate.Failure{
			Key: taskstate.Key{Queue: "dead", ID: id, Version: 2}, Attempt: 1, Err: "again", Dead: true}); err != nil {
			t.Fatal(err)
		}
	}
	c.previewThenRun(url.Values{"action": {"purge"}, "scope": {"filter"}, "queue": {"dead"}}, 4, 4)
	for _, id := range ids("d", 8)[4:] {
		if e.row(t, "dead", id).Exists {
			t.Errorf("dead/%s not purged", id)
		}
		e.waitRedis(t, "dead", id, func(i dispatch.TaskInfo) bool { return i.State == dispatch.StateMissing })
	}
	for _, id := range ids("d", 4) {
		if r := e.row(t, "dead", id); r.State != taskstate.Cancelled {
			t.Errorf("dead/%s: %+v", id, r)
		}
	}
}

// TestBulkBySearch acts on the tasks a search by payload finds.
func TestBulkBySearch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue(t, tasks("orders", time.Hour, `{"customer":{"id":42}}`, ids("a", 5)...)...)
	e.enqueue(t, tasks("orders", time.Hour, `{"customer":{"id":7}}`, ids("b", 5)...)...)
	c := e.client(t)
	c.login()
	_, page := c.get("/tasks?queue=orders&path=customer.id&value=42")
	if !strings.Contains(page, `name="path" value="customer.id"`) || !strings.Contains(page, `id="bulk-all"`) {
		t.Fatalf("no bulk form on the search page:\n%s", page)
	}
	c.previewThenRun(url.Values{"action": {"cancel"}, "scope": {"filter"}, "queue": {"orders"}, "path": {"customer.id"}, "value": {"42"}}, 5, 0)
	for id, r := range e.states(t, "orders", append(ids("a", 5), ids("b", 5)...)...) {
		if want := map[bool]taskstate.State{true: taskstate.Cancelled, false: taskstate.Pending}[id[0] == 'a']; r.State != want {
			t.Errorf("%s: %s, want %s", id, r.State, want)
		}
	}
}

// TestBulkActsOnAtMostThePreview: tasks that join the filter after the preview
// are acted on up to the margin, and the rest are left and counted.
func TestBulkActsOnAtMostThePreview(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue(t, tasks("grow", time.Hour, `{}`, ids("a", 2)...)...)
	c := e.client(t)
	c.login()
	form := url.Values{"action": {"cancel"}, "scope": {"filter"}, "queue": {"grow"}, "state": {"pending"}}
	if _, body := c.bulk("bulk", form); count(t, body, "act-count") != 2 || !strings.Contains(body, "at most 2 + 10 tasks") {
		t.Fatalf("preview:\n%s", body)
	}
	e.enqueue(t, tasks("grow", time.Hour, `{}`, ids("b", 20)...)...)
	form.Set("expect", "2")
	_, res := c.bulk("bulk-run", form)
	if count(t, res, "done-count") != 12 || !strings.Contains(res, `<p class="warn" id="left">10 more tasks`) {
		t.Errorf("result:\n%s", res)
	}
	n := 0
	for _, r := range e.states(t, "grow", append(ids("a", 2), ids("b", 20)...)...) {
		if r.State == taskstate.Cancelled {
			n++
		}
	}
	if n != 12 {
		t.Errorf("%d cancelled, want 12", n)
	}
}

// TestBulkRefused: no CSRF token, read-only mode and hostile or bad input are
// refused with a clear 4xx, the form kept and escaped, and nothing changed.
func TestBulkRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue(t, tasks("mail", time.Hour, `{}`, "a", "b")...)
	c := e.client(t)
	c.login()
	unchanged := func(what string) {
		t.Helper()
		for _, id := range []string{"a", "b"} {
			if r := e.row(t, "mail", id); r.State != taskstate.Pending || r.Version != 1 {
				t.Fatalf("%s changed mail/%s: %+v", what, id, r)
			}
		}
	}
	ok := url.Values{"action": {"cancel"}, "scope": {"filter"}, "queue": {"mail"}, "expect": {"2"}}
	for _, path := range []string{"/action/bulk", "/action/bulk-run"} {
		if resp, _ := c.post(path, ok); resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s without a CSRF token: %s", path, resp.Status)
		}
		if resp, _ := e.client(t).post(path, ok); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s anonymous: %s", path, resp.Status)
		}
	}
	unchanged("a request without a CSRF token")

	evil := `'; DROP TABLE delayq_outbox; -- <script>alert(1)</script>`
	many := make([]string, 501)
	for i := range many {
		many[i] = fmt.Sprintf("mail t%d", i)
	}
	for _, tc := range []struct {
		name string
		form url.Values
		want string
	}{
		{"unknown action", url.Values{"action": {"<b>drop</b>"}, "scope": {"filter"}, "queue": {"mail"}}, "choose an action"},
		{"no scope", url.Values{"action": {"cancel"}}, "choose the tasks"},
		{"nothing ticked", url.Values{"action": {"cancel"}, "scope": {"ticked"}}, "no task ticked"},
		{"too many ticked", url.Values{"action": {"cancel"}, "scope": {"ticked"}, "sel": many}, "501 tasks ticked: at most 500"},
		{"hostile tick", url.Values{"action": {"cancel"}, "scope": {"ticked"}, "sel": {"mail a", evil}}, "ticked task"},
		{"hostile queue", url.Values{"action": {"cancel"}, "scope": {"filter"}, "queue": {evil}}, "invalid queue"},
		{"hostile state", url.Values{"action": {"cancel"}, "scope": {"filter"}, "queue": {"mail"}, "state": {"pending' OR '1'='1"}}, "state"},
		{"hostile sort", url.Values{"action": {"cancel"}, "scope": {"filter"}, "queue": {"mail"}, "sort": {"id; DELETE"}}, "sort"},
		{"hostile time", url.Values{"action": {"cancel"}, "scope": {"filter"}, "queue": {"mail"}, "from": {evil}}, "want RFC 3339"},
		{"no queue", url.Values{"action": {"cancel"}, "scope": {"filter"}}, "choose a queue"},
		{"bad when", url.Values{"action": {"reschedule"}, "when": {"<i>soon</i>"}, "scope": {"filter"}, "queue": {"mail"}}, "reschedule to when"},
		{"negative delay", url.Values{"action": {"reschedule"}, "when": {"-5m"}, "scope": {"filter"}, "queue": {"mail"}}, "not negative"},
		{"hostile expect", url.Values{"action": {"cancel"}, "scope": {"filter"}, "queue": {"mail"}, "expect": {"1e9"}}, "expect"},
		{"search without a queue", url.Values{"action": {"cancel"}, "scope": {"filter"}, "path": {"a"}, "value": {evil}}, "choose a queue"},
	} {
		for _, path := range []string{"bulk", "bulk-run"} {
			form := url.Values{}
			for k, v := range tc.form {
				form[k] = v
			}
			if path == "bulk-run" && !form.Has("expect") {
				form.Set("expect", "2")
			}
			code, body := c.bulk(path, form)
			if code != http.StatusBadRequest || !strings.Contains(body, tc.want) {
				t.Errorf("%s, %s: %d, want 400 saying %q\n%s", tc.name, path, code, tc.want, body)
			}
			if low := strings.ToLower(body); strings.Contains(low, "<script") || strings.Contains(low, "<b>drop") || strings.Contains(low, "<i>soon") {
				t.Errorf("%s, %s: unescaped input on the page:\n%s", tc.name, path, body)
			}
			if !strings.Contains(body, `id="bulk-again"`) {
				t.Errorf("%s, %s: the form is not kept:\n%s", tc.name, path, body)
			}
		}
		unchanged(tc.name)
	}
	// The text typed is kept in the form.
	if _, body := c.bulk("bulk", url.Values{"action": {"reschedule"}, "when": {"tomorrow-ish"}, "scope": {"filter"}, "queue": {"mail"}}); !strings.Contains(body, `value="tomorrow-ish"`) {
		t.Errorf("the typed time is not kept:\n%s", body)
	}
	// A confirmation needs the preview's count.
	if code, body := c.bulk("bulk-run", url.Values{"action": {"cancel"}, "scope": {"filter"}, "queue": {"mail"}}); code != http.StatusBadRequest || !strings.Contains(body, "preview the action first") {
		t.Errorf("run without a preview: %d\n%s", code, body)
	}
	unchanged("the refused forms")
	var n int
	if err := e.pool.QueryRow(ctxT(t), `SELECT count(*) FROM delayq_outbox`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("the outbox after hostile input: %d rows, %v", n, err)
	}

	// Read-only: no bulk form on the list, and the actions are not served.
	ro := newEnv(t, func(c *Config) { c.Token, c.ReadOnly = "", true })
	ro.enqueue(t, tasks("mail", time.Hour, `{}`, "a")...)
	rc := ro.client(t)
	if _, body := rc.get("/tasks?queue=mail"); strings.Contains(body, `id="bulk"`) || strings.Contains(body, `name="sel"`) {
		t.Errorf("read-only list offers bulk actions:\n%s", body)
	}
	for _, path := range []string{"/action/bulk", "/action/bulk-run"} {
		if resp, _ := rc.post(path, ok); resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s in read-only mode: %s", path, resp.Status)
		}
	}
	if r := ro.row(t, "mail", "a"); r.State != taskstate.Pending {
		t.Fatalf("read-only mode changed the task: %+v", r)
	}
}

// TestBulkBatchesAndLimit: an action by filter on more than bulkMax tasks
// takes the first bulkMax, in batches of bulkBatch, and says the rest is left.
func TestBulkBatchesAndLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("10,050 rows")
	}
	t.Parallel()
	e := newEnv(t, nil)
	if _, err := e.pool.Exec(ctxT(t), `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state)
SELECT 'big', 'task-' || lpad(i::text, 6, '0'), now() + interval '1 hour' + i * interval '1 second', '{}', 25, 'pending'
FROM generate_series(1, $1::int) AS i`, bulkMax+50); err != nil {
		t.Fatal(err)
	}
	c := e.client(t)
	c.login()
	form := url.Values{"action": {"cancel"}, "scope": {"filter"}, "queue": {"big"}, "state": {"pending"}}
	code, body := c.bulk("bulk", form)
	if code != http.StatusOK || count(t, body, "act-count") != bulkMax || !strings.Contains(body, "More than 10000 match") {
		t.Fatalf("preview: %d\n%s", code, body)
	}
	form.Set("expect", strconv.Itoa(bulkMax))
	_, res := c.bulk("bulk-run", form)
	if count(t, res, "done-count") != bulkMax || count(t, res, "failed-count") != 0 || !strings.Contains(res, "preview again for the rest") {
		t.Fatalf("result:\n%s", res)
	}
	var cancelled, pending int
	if err := e.pool.QueryRow(ctxT(t), `SELECT count(*) FILTER (WHERE state = 'cancelled'), count(*) FILTER (WHERE state = 'pending')
FROM delayq_outbox WHERE queue = 'big'`).Scan(&cancelled, &pending); err != nil {
		t.Fatal(err)
	}
	if cancelled != bulkMax || pending != 50 {
		t.Fatalf("%d cancelled, %d pending; want %d and 50", cancelled, pending, bulkMax)
	}
	// The first in the list's order (pending: by due time) were taken.
	if r := e.row(t, "big", "task-000001"); r.State != taskstate.Cancelled {
		t.Errorf("the first task: %+v", r)
	}
	if r := e.row(t, "big", fmt.Sprintf("task-%06d", bulkMax+50)); r.State != taskstate.Pending {
		t.Errorf("the last task: %+v", r)
	}
}

// TestBulkFailedBatch: a batch whose statement fails is rolled back and counted
// as failed, with the error on the page; the batches before it stand.
func TestBulkFailedBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue(t, tasks("aaa", time.Hour, `{}`, "x", "y")...)
	e.enqueue(t, tasks("zzz", time.Hour, `{}`, "ok", "boom")...)
	// A real error from the database, for one row.
	if _, err := e.pool.Exec(ctxT(t), `CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'refused by a test trigger'; END $$;
CREATE TRIGGER refuse_boom BEFORE UPDATE ON delayq_outbox FOR EACH ROW WHEN (NEW.task_id = 'boom') EXECUTE FUNCTION refuse_boom()`); err != nil {
		t.Fatal(err)
	}
	c := e.client(t)
	c.login()
	res := c.previewThenRun(url.Values{"action": {"cancel"}, "scope": {"ticked"}, "sel": {"zzz ok", "zzz boom", "aaa x", "aaa y"}}, 4, 0)
	if count(t, res, "done-count") != 2 || count(t, res, "failed-count") != 2 || !strings.Contains(res, "refused by a test trigger") {
		t.Errorf("result:\n%s", res)
	}
	for q, want := range map[string]map[string]taskstate.State{
		"aaa": {"x": taskstate.Cancelled, "y": taskstate.Cancelled},
		"zzz": {"ok": taskstate.Pending, "boom": taskstate.Pending}, // its batch rolled back
	} {
		for id, st := range want {
			if r := e.row(t, q, id); r.State != st {
				t.Errorf("%s/%s: %s, want %s", q, id, r.State, st)
			}
		}
	}
}
