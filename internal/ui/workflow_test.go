package ui

import (
	"fmt"
	"html"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/workflow"
)

// finish marks queue/id done with result, as a completion does: the release
// trigger settles its edges.
func (e *env) finish(t *testing.T, queue, id string, result []byte) {
	t.Helper()
	tag, err := e.pool.Exec(ctxT(t), `UPDATE delayq_outbox SET state = 'done', done_at = now(), result = $3
WHERE queue = $1 AND task_id = $2 AND state IN ('pending', 'queued')`, queue, id, result)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("finish %s/%s: %v %v", queue, id, tag, err)
	}
}

// taskLink is the href of the task page of queue/id, as the page escapes it.
func taskLink(queue, id string) string {
	q := "/task?queue=" + url.QueryEscape(queue) + "&id=" + url.QueryEscape(id)
	return html.EscapeString(pctEscape.ReplaceAllStringFunc(q, strings.ToLower)) // html/template writes %3e
}

var pctEscape = regexp.MustCompile(`%[0-9A-F]{2}`)

// section is the HTML of the section with the id, "" when none.
func section(body, id string) string {
	i := strings.Index(body, `<section id="`+id+`">`)
	if i < 0 {
		return ""
	}
	j := strings.Index(body[i:], "</section>")
	return body[i : i+j]
}

// The task page of a chain's link, of a fan-in and of their dependencies: what
// each waits on (linked, with state and policy), its dependents, the workflow
// in dependency order, the stored result; hostile ids and results escaped.
func TestTaskPageWorkflow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := ctxT(t)
	wf := workflow.New(e.ob)
	const evil = `"><script>alert(1)</script>&x=`
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := wf.Chain(ctx, tx, workflow.Skip, outbox.Task{Queue: "ship", ID: "c1"},
			outbox.Task{Queue: "ship", ID: "c2"}, outbox.Task{Queue: "ship", ID: "c3"}); err != nil {
			return err
		}
		if _, err := e.ob.EnqueueMany(ctx, tx, []outbox.Task{{Queue: "pay", ID: "charge"}, {Queue: "pay", ID: evil}}); err != nil {
			return err
		}
		_, err := wf.Enqueue(ctx, tx, outbox.Task{Queue: "ship", ID: "send"},
			workflow.On("pay", "charge"), workflow.Dependency{Queue: "pay", ID: evil, OnFailure: workflow.Run})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	c := e.client(t)
	page := func(queue, id string) string {
		t.Helper()
		resp, body := c.get("/task?queue=" + url.QueryEscape(queue) + "&id=" + url.QueryEscape(id))
		if resp.StatusCode != 200 {
			t.Fatalf("%s/%s: %s\n%s", queue, id, resp.Status, body)
		}
		return body
	}
	want := func(what, body string, wants ...string) {
		t.Helper()
		for _, w := range wants {
			if !strings.Contains(body, w) {
				t.Errorf("%s lacks %q:\n%s", what, w, body)
			}
		}
	}

	// The chain's middle link: waits on c1, c3 waits on it, the chain in order.
	body := page("ship", "c2")
	want("c2", body, `<span id="pg-state" class="state waiting">waiting</span>`, `id="waits-for">Waits on 1 unfinished dependency`)
	want("c2's dependencies", section(body, "workflow"),
		`<a href="`+taskLink("ship", "c1")+`">ship/c1</a></td><td><span class="state pending">pending</span></td><td>skip</td><td>unfinished`,
		`<a href="`+taskLink("ship", "c3")+`">ship/c3</a></td><td><span class="state waiting">waiting</span></td><td>skip`)
	if flow := regexp.MustCompile(`class="flow-task[^"]*"><a href="[^"]*">([^<]*)</a> <span class="state (\w+)`).FindAllStringSubmatch(body, -1); fmt.Sprint(flow) !=
		"[[class=\"flow-task\"><a href=\""+taskLink("ship", "c1")+"\">ship/c1</a> <span class=\"state pending ship/c1 pending] "+
			"[class=\"flow-task this\"><a href=\""+taskLink("ship", "c2")+"\">ship/c2</a> <span class=\"state waiting ship/c2 waiting] "+
			"[class=\"flow-task\"><a href=\""+taskLink("ship", "c3")+"\">ship/c3</a> <span class=\"state waiting ship/c3 waiting]]" {
		t.Errorf("c2's workflow: %q", flow)
	}
	want("c2's agreement", body, "waiting on its dependencies")

	// The queue's list of waiting tasks (the queues page links its count there).
	if _, body := c.get("/tasks?queue=ship&state=waiting"); strings.Count(body, `<span class="state waiting">waiting</span>`) != 3 {
		t.Errorf("the waiting tasks of ship are not listed:\n%s", body)
	}

	// The fan-in: two dependencies, the hostile one escaped in text and link.
	body = page("ship", "send")
	want("send", section(body, "workflow"), "Waits on 2 unfinished dependencies",
		`<a href="`+taskLink("pay", "charge")+`">pay/charge</a>`,
		`<a href="`+taskLink("pay", evil)+`">pay/`+html.EscapeString(evil)+`</a></td><td><span class="state pending">pending</span></td><td>run`)
	if strings.Contains(body, "<script>alert(1)") {
		t.Error("the hostile id is not escaped")
	}
	// The hostile dependency finishes with a hostile result: send waits on
	// charge alone; the result is shown escaped.
	e.finish(t, "pay", evil, []byte(`<script>alert("r")</script>`))
	body = page("ship", "send")
	want("send, one left", section(body, "workflow"), "Waits on 1 unfinished dependency", "pay/charge")
	if strings.Contains(section(body, "workflow"), "pay/&#34;") {
		t.Error("a settled dependency is still listed")
	}
	body = page("pay", evil)
	want("the evil task's result", section(body, "result"), `<pre>&lt;script&gt;alert(&#34;r&#34;)&lt;/script&gt;</pre>`)
	want("the evil task's dependents", section(body, "workflow"), "its dependents were settled when it finished")
	if strings.Contains(body, `<script>alert("r")`) || strings.Contains(body, "<script>alert(1)") {
		t.Error("the hostile result or id is not escaped")
	}
	// A binary result is shown as hex, said so.
	e.finish(t, "pay", "charge", []byte{0xff, 0x00, 0x41})
	want("charge's result", section(page("pay", "charge"), "result"), "00000000  ff 00 41", "Not UTF-8")
	if got := e.row(t, "ship", "send").State; got != taskstate.Pending {
		t.Fatalf("send is %s after its dependencies finished", got)
	}
	body = page("ship", "send")
	if section(body, "workflow") != "" || section(body, "result") != "" {
		t.Error("a released task without dependents or result shows a workflow or result")
	}

	// A waiting task can be cancelled from its page; its dependent, on the
	// policy Skip, is cancelled with it.
	c.login()
	if body := page("ship", "c2"); !strings.Contains(body, `id="cancel"`) || !strings.Contains(body, `id="reschedule"`) || strings.Contains(body, `id="run-now"`) {
		t.Error("a waiting task's page lacks its actions, or offers run now")
	}
	c.act("cancel", url.Values{"queue": {"ship"}, "id": {"c2"}})
	if got := e.row(t, "ship", "c3").State; got != taskstate.Cancelled {
		t.Errorf("c3 is %s after c2 was cancelled", got)
	}

	// A task without dependencies shows no section.
	e.enqueue(t, outbox.Task{Queue: "mail", ID: "plain"})
	if body := page("mail", "plain"); section(body, "workflow") != "" || section(body, "result") != "" {
		t.Error("a plain task shows a workflow or a result")
	}
}

// The dependents of a fan-out are listed to 100, the rest counted; the
// workflow walk stops at its bound and says so.
func TestTaskPageWorkflowBounds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := ctxT(t)
	wf := workflow.New(e.ob)
	e.enqueue(t, outbox.Task{Queue: "fan", ID: "root"})
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		for i := range workflowBound + 5 {
			if _, err := wf.Enqueue(ctx, tx, outbox.Task{Queue: "fan", ID: fmt.Sprintf("leaf-%04d", i)}, workflow.On("fan", "root")); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_, body := e.client(t).get("/task?queue=fan&id=root")
	w := section(body, "workflow")
	if n := strings.Count(w, `<tr class="dependent">`); n != linksShown {
		t.Errorf("%d dependents listed, want %d", n, linksShown)
	}
	if !strings.Contains(w, fmt.Sprintf(`id="more-dependents" class="hint">and %d more not listed`, workflowBound+5-linksShown)) {
		t.Errorf("no count of the rest:\n%s", w)
	}
	if n := strings.Count(w, `class="flow-task`); n != workflowBound || !strings.Contains(w, `id="flow-truncated"`) {
		t.Errorf("workflow of %d tasks, truncation said: %v", n, strings.Contains(w, `id="flow-truncated"`))
	}
	if !strings.Contains(w, `class="flow-task this"><a href="/task?queue=fan&amp;id=root">fan/root</a>`) {
		t.Error("the root is not first")
	}
}

// With payloads hidden, a stored result is not shown either: its size is.
func TestTaskPageResultHidden(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.HidePayloads = true })
	e.enqueue(t, outbox.Task{Queue: "pay", ID: "r"})
	e.finish(t, "pay", "r", []byte("card 4242-4242"))
	_, body := e.client(t).get("/task?queue=pay&id=r")
	if r := section(body, "result"); !strings.Contains(r, "Results are hidden on this dashboard, as payloads (14 B)") || strings.Contains(body, "4242") {
		t.Errorf("hidden result:\n%s", r)
	}
}

// The page of a batch's callback shows the batch's counts; a child's page
// shows none.
func TestTaskPageBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := ctxT(t)
	wf := workflow.New(e.ob)
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := wf.Batch(ctx, tx, outbox.Task{Queue: "album", ID: "a1"},
			[]outbox.Task{{Queue: "img", ID: "1"}, {Queue: "img", ID: "2"}, {Queue: "img", ID: "3"}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'dead', done_at = now() WHERE queue = 'img' AND task_id = '2'`); err != nil {
		t.Fatal(err)
	}
	c := e.client(t)
	resp, body := c.get("/task?queue=album&id=a1")
	if resp.StatusCode != 200 || !strings.Contains(body, `id="batch-progress">3 children: 2 not finished, 0 done, 1 dead, 0 cancelled.`) {
		t.Errorf("callback page: %s\n%s", resp.Status, body)
	}
	if _, body := c.get("/task?queue=img&id=1"); strings.Contains(body, `id="batch"`) {
		t.Errorf("a child's page shows a batch:\n%s", body)
	}
}
