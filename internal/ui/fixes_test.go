package ui

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
)

// An invalid JSON edit of a dead task shows the task's page again, the text as
// typed in the edit box and why it was refused inline: nothing typed is lost.
func TestEditRefusedKeepsTheText(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue(t, outbox.Task{Queue: "pay", ID: "o1", Payload: []byte(`{"card":"4111"}`), Delay: time.Hour})
	e.kill(t, "pay", "o1", "card declined")
	c := e.client(t)
	c.login()
	typed := "{\n  \"card\": \"5555\",\n  \"amount\": <42>\n"
	resp, body := c.post("/action/edit-retry", url.Values{"queue": {"pay"}, "id": {"o1"}, "version": {"1"}, "kind": {"json"},
		"payload": {typed}, "csrf": {c.csrf("/consistency")}})
	if resp.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("status %s, want 422", resp.Status)
	}
	for _, want := range []string{`id="edit-error"`, "the payload was JSON and the edit is not",
		`aria-invalid="true"`, "&#34;amount&#34;: &lt;42&gt;\n</textarea>", `id="pg-state" class="state dead"`} {
		if !strings.Contains(body, want) {
			t.Errorf("the refused edit's page lacks %q:\n%s", want, body)
		}
	}
	if r := e.row(t, "pay", "o1"); r.State != taskstate.Dead || r.Version != 1 {
		t.Fatalf("refused edit changed the row: %+v", r)
	}
}

// A done task shows its outcome: no red error left from a failed attempt, no
// "attempts 0 of 25", no grey "missing" badge for a Redis that rightly let it go.
func TestDoneTaskShowsItsOutcome(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue(t, outbox.Task{Queue: "mail", ID: "ok-first", Payload: []byte(`{}`), Delay: time.Hour},
		outbox.Task{Queue: "mail", ID: "ok-third", Payload: []byte(`{}`), Delay: time.Hour})
	// As the worker leaves them: a failure recorded, then the run that succeeded.
	if _, err := e.pool.Exec(ctxT(t), `UPDATE delayq_outbox SET attempt = 2, last_error = 'smtp timeout' WHERE task_id = 'ok-third'`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctxT(t), `UPDATE delayq_outbox SET state = 'done', done_at = now() WHERE queue = 'mail'`); err != nil {
		t.Fatal(err)
	}
	c := e.client(t)
	for id, want := range map[string][]string{
		"ok-first": {`id="pg-outcome"`, "at its first attempt", `id="redis-released"`},
		"ok-third": {`id="pg-outcome"`, "after 2 failed attempts", `id="pg-earlier-error"`, "smtp timeout", `id="redis-released"`},
	} {
		resp, body := c.get("/task?queue=mail&id=" + id)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %s", id, resp.Status)
		}
		for _, w := range want {
			if !strings.Contains(body, w) {
				t.Errorf("%s lacks %q", id, w)
			}
		}
		for _, bad := range []string{`class="err">smtp`, "0 of 25", `r-missing`} {
			if strings.Contains(body, bad) {
				t.Errorf("%s shows %q", id, bad)
			}
		}
	}
}

// Every registered queue is listed, with or without rows: one a worker serves
// (Redis's registry) and one paused before its first task (its controls row);
// the first can be paused from the page.
func TestQueuesWithoutRowsAreListed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	if err := e.dq.Register(ctxT(t), "invoices"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.h.queues.Pause(ctxT(t), "receipts"); err != nil {
		t.Fatal(err)
	}
	c := e.client(t)
	c.login()
	resp, body := c.get("/")
	if resp.StatusCode != 200 {
		t.Fatalf("%s\n%s", resp.Status, body)
	}
	for _, want := range []string{`data-queue="invoices"`, `data-queue="receipts"`, `data-paused="true"`} {
		if !strings.Contains(body, want) {
			t.Errorf("queues page lacks %q", want)
		}
	}
	c.act("pause", url.Values{"queue": {"invoices"}})
	if p, err := e.redisPaused(t, "invoices"); err != nil || !p {
		t.Errorf("invoices paused in Redis: %v %v", p, err)
	}
}

// The label at the top right says who is logged in and how, not a bare "token".
func TestWhoLabelExplained(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.BasicUser, c.BasicPassword = "ops", "secret-password" })
	c := e.client(t)
	c.login()
	_, body := c.get("/")
	if !strings.Contains(body, `id="who" title="You logged in with the dashboard's token`) || !strings.Contains(body, ">logged in with the token</span>") {
		t.Errorf("the token's label is not explained:\n%s", body)
	}
	req := mustReq(e.srv.URL + "/")
	req.RequestURI = ""
	req.SetBasicAuth("ops", "secret-password")
	resp, body := (&client{t: t, e: e, http: http.DefaultClient}).do(req)
	if resp.StatusCode != 200 || !strings.Contains(body, ">logged in as ops</span>") || !strings.Contains(body, "HTTP basic credentials") {
		t.Errorf("basic: %s\n%s", resp.Status, body)
	}
}
