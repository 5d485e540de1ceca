package ui

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
)

func TestNewRefusesActionsWithoutCredentials(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for _, cfg := range []Config{
		{DB: e.pool, Redis: e.dq, Outbox: e.ob},
		{DB: e.pool, Redis: e.dq, Outbox: e.ob, Token: "short"},
		{DB: e.pool, Redis: e.dq, Outbox: e.ob, BasicUser: "u"},
		{DB: e.pool, Redis: e.dq, Outbox: e.ob, ReadOnly: true, AuthReads: true},
		{DB: e.pool, Redis: e.dq, Outbox: e.ob, Token: testToken, BasePath: "/ui/"},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v): no error", cfg)
		}
	}
}

func TestQueuesPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue(t,
		outbox.Task{Queue: "mail", ID: "m1", Payload: []byte(`{}`), Delay: time.Hour},
		outbox.Task{Queue: "mail", ID: "m2", Payload: []byte(`{}`), Delay: time.Hour},
		outbox.Task{Queue: "payment", ID: "p1", Payload: []byte(`{}`), Delay: time.Hour},
	)
	e.kill(t, "payment", "p1", "declined")
	c := e.client(t)
	resp, body := c.get("/")
	if resp.StatusCode != 200 {
		t.Fatalf("%s\n%s", resp.Status, body)
	}
	for _, want := range []string{`data-queue="mail"`, `data-queue="payment"`,
		`data-count="pending" href="/tasks?queue=mail&amp;state=pending">2<`,
		`data-count="dead" href="/dead?queue=payment">1<`, `log in to act`} {
		if !strings.Contains(body, want) {
			t.Errorf("queues page lacks %q", want)
		}
	}
	if _, body := c.get("/?refresh=3"); !strings.Contains(body, `<meta http-equiv="refresh" content="3">`) {
		t.Error("no refresh")
	}
}

func TestTaskListsPaginateAndFilter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil) // 5 rows a page
	var tasks []outbox.Task
	for i := range 12 {
		tasks = append(tasks, outbox.Task{Queue: "mail", ID: fmt.Sprintf("a-%02d", i), Payload: []byte(`{}`), Delay: time.Duration(i+1) * time.Hour})
	}
	tasks = append(tasks, outbox.Task{Queue: "mail", ID: "b-1", Payload: []byte(`{}`), Delay: time.Hour})
	e.enqueue(t, tasks...)
	c := e.client(t)
	idRE := regexp.MustCompile(`<tr data-id="([^"]+)">`)
	nextRE := regexp.MustCompile(`id="next" href="([^"]+)"`)
	walk := func(path string) []string {
		var ids []string
		for range 10 {
			resp, body := c.get(path)
			if resp.StatusCode != 200 {
				t.Fatalf("%s: %s\n%s", path, resp.Status, body)
			}
			for _, m := range idRE.FindAllStringSubmatch(body, -1) {
				ids = append(ids, m[1])
			}
			m := nextRE.FindStringSubmatch(body)
			if m == nil {
				return ids
			}
			path = strings.ReplaceAll(m[1], "&amp;", "&")
		}
		t.Fatal("too many pages")
		return nil
	}
	if ids := walk("/tasks?queue=mail"); len(ids) != 13 || ids[0] != "a-00" || ids[12] != "b-1" {
		t.Errorf("by id: %v", ids)
	}
	if ids := walk("/tasks?queue=mail&prefix=a-1"); strings.Join(ids, ",") != "a-10,a-11" {
		t.Errorf("prefix: %v", ids)
	}
	// Pending, by due time, within a range.
	from := time.Now().Add(150 * time.Minute).UTC().Format("2006-01-02 15:04:05")
	to := time.Now().Add(330 * time.Minute).UTC().Format("2006-01-02 15:04:05")
	if ids := walk("/tasks?queue=mail&state=pending&from=" + url.QueryEscape(from) + "&to=" + url.QueryEscape(to)); strings.Join(ids, ",") != "a-02,a-03,a-04" {
		t.Errorf("due range: %v", ids)
	}
	// An exact id goes to the task's page.
	resp, _ := c.get("/tasks?queue=mail&id=b-1")
	if loc := resp.Header.Get("Location"); loc != "/task?queue=mail&id=b-1" {
		t.Errorf("exact id: %s %q", resp.Status, loc)
	}
	if _, body := c.get("/tasks?state=queued"); !strings.Contains(body, "choose a queue") {
		t.Error("a list by id without a queue is not refused")
	}
}

func TestTaskPageShowsBothStores(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.PayloadCap = 64 })
	e.enqueue(t, outbox.Task{Queue: "mail", ID: "j1", Payload: []byte(`{"to":"ann@example.com","n":[1,2]}`), Delay: time.Hour, Priority: 7},
		outbox.Task{Queue: "mail", ID: "big", Payload: []byte(`{"x":"` + strings.Repeat("y", 200) + `"}`), Delay: time.Hour})
	c := e.client(t)
	_, body := c.get("/task?queue=mail&id=j1")
	for _, want := range []string{`id="pg-state" class="state pending">pending<`, `id="redis-state" class="state r-missing">missing<`,
		`id="pg-priority">7<`,
		"waiting for the relay", "{\n  &#34;to&#34;: &#34;ann@example.com&#34;,\n  &#34;n&#34;: [\n    1,"} {
		if !strings.Contains(body, want) {
			t.Errorf("task page lacks %q:\n%s", want, body)
		}
	}
	_, body = c.get("/task?queue=mail&id=big")
	if !strings.Contains(body, "Cut to its first 64 B of 208 B") || strings.Contains(body, strings.Repeat("y", 100)) {
		t.Errorf("payload not capped:\n%s", body)
	}
	if resp, _ := c.get("/task?queue=mail&id=nope"); resp.StatusCode != 404 {
		t.Errorf("missing task: %s", resp.Status)
	}
}

// A task id, a payload and an error built to inject script come out escaped on
// every page, and no page carries a script or an inline style.
func TestEverythingEscaped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	evilID := `<script>alert(1)</script>`
	evilID2 := `"><img/src=x/onerror=alert(2)>`
	e.enqueue(t,
		outbox.Task{Queue: "evil", ID: evilID, Payload: []byte(`{"x":"</pre><script>alert(3)</script>"}`), Delay: time.Hour},
		outbox.Task{Queue: "evil", ID: evilID2, Payload: []byte(`</pre><script>alert(4)</script>`), Delay: time.Hour},
	)
	e.kill(t, "evil", evilID2, `<script>alert(5)</script>`)
	c := e.client(t)
	c.login()
	for _, path := range []string{"/", "/tasks?queue=evil", "/dead", "/dead?queue=evil",
		"/task?queue=evil&id=" + url.QueryEscape(evilID), "/task?queue=evil&id=" + url.QueryEscape(evilID2),
		"/tasks?queue=evil&prefix=" + url.QueryEscape(`<script>`), "/tasks?queue=evil&from=" + url.QueryEscape(`<script>x`),
		"/consistency", "/login"} {
		resp, body := c.get(path)
		if resp.StatusCode >= 500 {
			t.Fatalf("%s: %s", path, resp.Status)
		}
		low := strings.ToLower(body)
		if strings.Contains(low, "<script") || strings.Contains(low, "<img") || strings.Contains(low, " style=") || strings.Contains(low, "onerror=alert") && !strings.Contains(low, "&gt;") {
			t.Errorf("%s: unescaped markup:\n%s", path, body)
		}
		csp := resp.Header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "unsafe-inline") {
			t.Errorf("%s: CSP %q", path, csp)
		}
		for _, hd := range []string{"X-Content-Type-Options", "X-Frame-Options", "Referrer-Policy"} {
			if resp.Header.Get(hd) == "" {
				t.Errorf("%s: no %s", path, hd)
			}
		}
	}
	_, body := c.get("/task?queue=evil&id=" + url.QueryEscape(evilID))
	if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") || !strings.Contains(body, "&lt;/pre&gt;&lt;script&gt;alert(3)") {
		t.Errorf("escaped forms missing:\n%s", body)
	}
}

func TestActionsNeedAuthenticationAndCSRF(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue(t, outbox.Task{Queue: "mail", ID: "a", Payload: []byte(`{}`), Delay: time.Hour})
	form := func(csrf string) url.Values {
		return url.Values{"queue": {"mail"}, "id": {"a"}, "csrf": {csrf}}
	}
	anon := e.client(t)
	if resp, _ := anon.post("/action/cancel", form("")); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("anonymous: %s", resp.Status)
	}
	if _, body := anon.get("/task?queue=mail&id=a"); strings.Contains(body, "/action/") {
		t.Error("action forms shown to an anonymous visitor")
	}
	if resp, _ := anon.post("/login", url.Values{"token": {"wrong-token-0123456789"}}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("wrong token: %s", resp.Status)
	}
	c := e.client(t)
	c.login()
	if resp, _ := c.post("/action/cancel", form("")); resp.StatusCode != http.StatusForbidden {
		t.Errorf("no CSRF token: %s", resp.Status)
	}
	if resp, _ := c.post("/action/cancel", form(strings.Repeat("0", 64))); resp.StatusCode != http.StatusForbidden {
		t.Errorf("wrong CSRF token: %s", resp.Status)
	}
	// A cross-site form, even with a valid token, is refused.
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/action/cancel", strings.NewReader(form(c.csrf("/consistency")).Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if resp, _ := c.do(req); resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-site: %s", resp.Status)
	}
	if r := e.row(t, "mail", "a"); r.State != taskstate.Pending {
		t.Fatalf("refused requests changed the task: %+v", r)
	}
	// A bearer token needs no CSRF token (no browser sends it by itself).
	req, _ = http.NewRequest(http.MethodPost, e.srv.URL+"/action/cancel", strings.NewReader(form("").Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+testToken)
	if resp, body := e.client(t).do(req); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("bearer: %s %s", resp.Status, body)
	}
	if r := e.row(t, "mail", "a"); r.State != taskstate.Cancelled {
		t.Fatalf("bearer cancel: %+v", r)
	}
}

func TestBasicAuth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.Token, c.BasicUser, c.BasicPassword, c.AuthReads = "", "ops", "s3cret-pass", true })
	e.enqueue(t, outbox.Task{Queue: "mail", ID: "a", Payload: []byte(`{}`), Delay: time.Hour})
	c := e.client(t)
	resp, _ := c.get("/")
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic") {
		t.Fatalf("reads without credentials: %s", resp.Status)
	}
	get := func(user, pass string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/task?queue=mail&id=a", nil)
		req.SetBasicAuth(user, pass)
		return c.do(req)
	}
	if resp, _ := get("ops", "wrong"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("wrong password: %s", resp.Status)
	}
	resp, body := get("ops", "s3cret-pass")
	m := csrfRE.FindStringSubmatch(body)
	if resp.StatusCode != 200 || m == nil {
		t.Fatalf("basic: %s\n%s", resp.Status, body)
	}
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/action/reschedule",
		strings.NewReader(url.Values{"queue": {"mail"}, "id": {"a"}, "when": {"2h"}, "csrf": {m[1]}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth("ops", "s3cret-pass")
	if resp, body := c.do(req); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("reschedule: %s %s", resp.Status, body)
	}
	if r := e.row(t, "mail", "a"); r.Version != 2 {
		t.Fatalf("reschedule: %+v", r)
	}
}

func TestReadOnlyAndHiddenPayloads(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.Token, c.ReadOnly, c.HidePayloads = "", true, true })
	e.enqueue(t, outbox.Task{Queue: "mail", ID: "a", Payload: []byte(`{"secret":"hunter2"}`), Delay: time.Hour})
	e.kill(t, "mail", "a", "boom")
	c := e.client(t)
	for _, path := range []string{"/", "/dead", "/task?queue=mail&id=a"} {
		_, body := c.get(path)
		if strings.Contains(body, "/action/") || strings.Contains(body, "hunter2") || strings.Contains(body, "log in") {
			t.Errorf("%s: actions or payload shown in read-only, payload-hiding mode:\n%s", path, body)
		}
	}
	if resp, _ := c.post("/action/retry", url.Values{"queue": {"mail"}, "id": {"a"}}); resp.StatusCode != http.StatusMethodNotAllowed && resp.StatusCode != http.StatusNotFound {
		t.Errorf("action in read-only mode: %s", resp.Status)
	}
	if r := e.row(t, "mail", "a"); r.State != taskstate.Dead {
		t.Fatalf("read-only mode changed the task: %+v", r)
	}
}

func TestActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue(t,
		outbox.Task{Queue: "mail", ID: "c", Payload: []byte(`{}`), Delay: time.Hour},
		outbox.Task{Queue: "mail", ID: "r", Payload: []byte(`{}`), Delay: time.Hour},
		outbox.Task{Queue: "mail", ID: "n", Payload: []byte(`{}`), Delay: time.Hour},
		outbox.Task{Queue: "mail", ID: "d1", Payload: []byte(`{}`), Delay: time.Hour},
		outbox.Task{Queue: "mail", ID: "d2", Payload: []byte(`{}`), Delay: time.Hour},
		outbox.Task{Queue: "mail", ID: "d3", Payload: []byte(`{}`), Delay: time.Hour},
		outbox.Task{Queue: "mail", ID: "d4", Payload: []byte(`{}`), Delay: time.Hour},
	)
	for _, id := range []string{"d1", "d2", "d3", "d4"} {
		e.kill(t, "mail", id, "boom")
	}
	c := e.client(t)
	c.login()
	kv := func(id string, more ...string) url.Values {
		v := url.Values{"queue": {"mail"}, "id": {id}}
		for i := 0; i+1 < len(more); i += 2 {
			v.Set(more[i], more[i+1])
		}
		return v
	}
	if loc := c.act("cancel", kv("c")); loc != "/task?id=c&ok=cancelled&queue=mail" && loc != "/task?id=c&queue=mail&ok=cancelled" {
		t.Errorf("cancel went to %q", loc)
	}
	before := time.Now()
	c.act("reschedule", kv("r", "when", "3h"))
	c.act("run-now", kv("n", "back", "/tasks?queue=mail"))
	c.act("retry", kv("d1"))
	c.act("purge", kv("d2"))
	for id, want := range map[string]taskstate.RowState{
		"c": {Exists: true, State: taskstate.Cancelled, Version: 1}, "r": {Exists: true, State: taskstate.Pending, Version: 2},
		"n": {Exists: true, State: taskstate.Pending, Version: 2}, "d1": {Exists: true, State: taskstate.Pending, Version: 2},
		"d2": {},
	} {
		if r := e.row(t, "mail", id); r.Exists != want.Exists || r.State != want.State || r.Version != want.Version {
			t.Errorf("%s: %+v, want %+v", id, r, want)
		}
	}
	row, _, err := e.h.browse.Task(ctxT(t), e.pool, "mail", "r", 0)
	if err != nil || row.RunAt.Before(before.Add(3*time.Hour-time.Second)) || row.RunAt.After(time.Now().Add(3*time.Hour)) {
		t.Errorf("reschedule: run_at %v (%v)", row.RunAt, err)
	}
	// An action refused by the API says why.
	form := kv("c")
	form.Set("csrf", c.csrf("/consistency"))
	if resp, body := c.post("/action/cancel", form); resp.StatusCode != http.StatusConflict || !strings.Contains(body, "finished") {
		t.Errorf("cancel of a cancelled task: %s\n%s", resp.Status, body)
	}
	// Purge all asks to type the queue's name, and does nothing until it is.
	form = url.Values{"queue": {"mail"}, "csrf": {c.csrf("/consistency")}}
	if resp, body := c.post("/action/purge-all", form); resp.StatusCode != 200 || !strings.Contains(body, `id="confirm"`) {
		t.Fatalf("purge all without confirmation: %s\n%s", resp.Status, body)
	}
	form.Set("confirm", "other")
	if _, body := c.post("/action/purge-all", form); !strings.Contains(body, "nothing was done") {
		t.Fatalf("purge all with a wrong confirmation:\n%s", body)
	}
	if r := e.row(t, "mail", "d3"); r.State != taskstate.Dead {
		t.Fatalf("unconfirmed purge: %+v", r)
	}
	c.act("purge-all", url.Values{"queue": {"mail"}, "confirm": {"mail"}})
	if e.row(t, "mail", "d3").Exists || e.row(t, "mail", "d4").Exists {
		t.Error("purge all left dead rows")
	}
	// A consistency check.
	if loc := c.act("check", url.Values{}); loc != "/consistency?ok=checked" {
		t.Errorf("check went to %q", loc)
	}
	if _, body := c.get("/consistency"); !strings.Contains(body, `<strong id="found">`) {
		t.Errorf("no check report:\n%s", body)
	}
	// back= cannot leave the dashboard.
	form = kv("n", "back", "//evil.example/x")
	if loc := c.act("run-now", form); !strings.HasPrefix(loc, "/task?") {
		t.Errorf("back led to %q", loc)
	}
}

func TestMountedUnderAPath(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	h, err := New(Config{DB: e.pool, Redis: e.dq, Outbox: e.ob, ReadOnly: true, BasePath: "/ops/delayq"})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/delayq/", h)
	e.enqueue(t, outbox.Task{Queue: "mail", ID: "a", Payload: []byte(`{}`), Delay: time.Hour})
	for _, path := range []string{"/ops/delayq/", "/ops/delayq/tasks?queue=mail", "/ops/delayq/static/style.css"} {
		rec := newRecorder()
		mux.ServeHTTP(rec, mustReq(path))
		if rec.Code != 200 {
			t.Errorf("%s: %d", path, rec.Code)
		}
		if strings.HasSuffix(path, "mail") && !strings.Contains(rec.Body.String(), `href="/ops/delayq/task?queue=mail&amp;id=a"`) {
			t.Errorf("links do not carry the base path:\n%s", rec.Body.String())
		}
	}
}

// The queues page charts the last hour from the workers' history, and shows and
// toggles the pause flag in both stores.
func TestQueuesPageChartsAndPause(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.runSystem(t, "mail")
	var tasks []outbox.Task
	for i := range 20 {
		tasks = append(tasks, outbox.Task{Queue: "mail", ID: fmt.Sprintf("w%02d", i), Payload: []byte(`{}`)})
	}
	e.enqueue(t, tasks...)
	c := e.client(t)
	c.login()
	doneRE := regexp.MustCompile(`data-done-hour="(\d+)" data-claims-hour="(\d+)"`)
	deadline := time.Now().Add(30 * time.Second)
	var body string
	for {
		_, body = c.get("/")
		if m := doneRE.FindStringSubmatch(body); m != nil && m[1] == "20" && m[2] == "20" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hour never counted 20 done and 20 claims:\n%s", body)
		}
		time.Sleep(50 * time.Millisecond) // the acknowledgements follow the commits by a moment
	}
	for _, want := range []string{`<svg class="chart throughput"`, `<rect class="bar"`, `<svg class="chart lateness"`,
		`<path class="p50"`, `<path class="p99"`, `data-paused="false"`, `action="/action/pause"`} {
		if !strings.Contains(body, want) {
			t.Errorf("queues page lacks %q", want)
		}
	}
	c.act("pause", url.Values{"queue": {"mail"}})
	if _, body := c.get("/"); !strings.Contains(body, `data-paused="true"`) || !strings.Contains(body, `action="/action/resume"`) {
		t.Errorf("paused queue not shown paused:\n%s", body)
	}
	if p, err := e.redisPaused(t, "mail"); err != nil || !p {
		t.Errorf("Redis paused %v %v", p, err)
	}
	c.act("resume", url.Values{"queue": {"mail"}})
	if _, body := c.get("/"); !strings.Contains(body, `data-paused="false"`) {
		t.Error("resumed queue shown paused")
	}
	if p, err := e.redisPaused(t, "mail"); err != nil || p {
		t.Errorf("Redis paused after resume %v %v", p, err)
	}
	if resp, _ := c.post("/action/pause", url.Values{"queue": {"mail"}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("pause without a CSRF token: %s", resp.Status)
	}
}

// A dead task's payload edited on its page is retried as a new version; a payload
// that was JSON must stay JSON, and an edit of a version that moved on is refused.
func TestEditThenRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue(t, outbox.Task{Queue: "pay", ID: "o1", Payload: []byte(`{"card":"4111","amount":42}`), Delay: time.Hour},
		outbox.Task{Queue: "pay", ID: "bin", Payload: []byte{0xff, 0x00, 0xfe}, Delay: time.Hour})
	e.kill(t, "pay", "o1", "card declined")
	e.kill(t, "pay", "bin", "bad bytes")
	c := e.client(t)
	c.login()
	_, body := c.get("/task?queue=pay&id=o1")
	if !strings.Contains(body, `<textarea id="edit-payload" name="payload"`) || !strings.Contains(body, "&#34;card&#34;: &#34;4111&#34;") {
		t.Fatalf("no edit form with the payload:\n%s", body)
	}
	if _, body := c.get("/task?queue=pay&id=bin"); strings.Contains(body, "edit-payload") {
		t.Error("a binary payload offered for editing")
	}
	form := func(version, payload string) url.Values {
		return url.Values{"queue": {"pay"}, "id": {"o1"}, "version": {version}, "kind": {"json"}, "payload": {payload},
			"csrf": {c.csrf("/consistency")}}
	}
	if resp, body := c.post("/action/edit-retry", form("1", `{"card":`)); resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, "not") {
		t.Errorf("invalid JSON: %s\n%s", resp.Status, body)
	}
	if r := e.row(t, "pay", "o1"); r.State != taskstate.Dead || r.Version != 1 {
		t.Fatalf("refused edit changed the row: %+v", r)
	}
	if resp, body := c.post("/action/edit-retry", form("1", "{\n  \"card\": \"5555\",\n  \"amount\": 42\n}")); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("edit: %s\n%s", resp.Status, body)
	}
	row, _, err := e.h.browse.Task(ctxT(t), e.pool, "pay", "o1", 1<<10)
	if err != nil || row.State != taskstate.Pending || row.Version != 2 || row.Attempt != 0 || string(row.Payload) != `{"card":"5555","amount":42}` {
		t.Fatalf("after the edit: %+v %v", row, err)
	}
	if resp, body := c.post("/action/edit-retry", form("1", `{}`)); resp.StatusCode != http.StatusConflict || !strings.Contains(body, "changed since") {
		t.Errorf("stale edit: %s\n%s", resp.Status, body)
	}
}
