package uibrowser

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/workflow"
)

// TestBrowserWorkflow: an operator opens a task that waits on its
// dependencies (an order's shipment, waiting on the stock's reservation and the
// charge), reads what it waits on and the workflow in dependency order, then
// follows the link to a dependency and finds the shipment among its
// dependents. Its own browser process.
func TestBrowserWorkflow(t *testing.T) {
	t.Parallel()
	b := newBrowser(t, 1400, 1000)

	e := newEnv(t)
	ctx := ctxT(t)
	wf := workflow.New(e.ob)
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := e.ob.EnqueueMany(ctx, tx, []outbox.Task{
			{Queue: "stock", ID: "reserve-1001", Payload: []byte(`{"order":1001}`)},
			{Queue: "payment", ID: "charge-1001", Payload: []byte(`{"order":1001,"cents":4200}`)},
		}); err != nil {
			return err
		}
		if _, err := wf.Enqueue(ctx, tx, outbox.Task{Queue: "shipping", ID: "ship-1001", Payload: []byte(`{"order":1001}`)},
			workflow.On("stock", "reserve-1001"), workflow.On("payment", "charge-1001")); err != nil {
			return err
		}
		_, err := wf.Enqueue(ctx, tx, outbox.Task{Queue: "mail", ID: "shipped-1001"}, workflow.On("shipping", "ship-1001"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// The reservation is done with its result: one dependency left.
	if _, err := e.pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'done', done_at = now(), result = '{"warehouse":"lyon"}'
WHERE queue = 'stock' AND task_id = 'reserve-1001'`); err != nil {
		t.Fatal(err)
	}

	_, run := b.tab(t)
	var buf []byte
	var state, waits, deps, flow, title string
	var dependents string
	run(login(e),
		chromedp.Navigate(e.srv.URL+"/task?queue=shipping&id=ship-1001"),
		chromedp.WaitVisible(`#workflow`, chromedp.ByQuery),
		chromedp.Text(`#pg-state`, &state, chromedp.ByQuery),
		chromedp.Text(`#waits-for`, &waits, chromedp.ByQuery),
		chromedp.Evaluate(`[...document.querySelectorAll('#deps tr.dep')].map(r => r.innerText.replace(/\s+/g, ' ').trim()).join('|')`, &deps),
		chromedp.Evaluate(`[...document.querySelectorAll('#flow li')].map(l => l.querySelector('a').textContent + ' ' + l.querySelector('.state').textContent).join('|')`, &flow),
		b.screenshot("workflow", &buf))
	if state != "waiting" || !strings.Contains(waits, "Waits on 1 unfinished dependency") ||
		deps != "payment/charge-1001 pending fail unfinished" ||
		flow != "payment/charge-1001 pending|shipping/ship-1001 waiting|mail/shipped-1001 waiting" {
		t.Fatalf("ship-1001: state %q, %q, dependencies %q, workflow %q", state, waits, deps, flow)
	}
	// Follow the dependency's link: the charge, with the shipment among its
	// dependents and the workflow from its side.
	run(chromedp.Click(`#deps tr.dep a`, chromedp.ByQuery),
		chromedp.WaitVisible(`#dependents`, chromedp.ByQuery),
		chromedp.Title(&title),
		chromedp.Evaluate(`[...document.querySelectorAll('#dependents tr.dependent')].map(r => r.innerText.replace(/\s+/g, ' ').trim()).join('|')`, &dependents),
		chromedp.Evaluate(`[...document.querySelectorAll('#flow li')].map(l => l.querySelector('a').textContent).join('|')`, &flow))
	if !strings.Contains(title, "charge-1001") || dependents != "shipping/ship-1001 waiting fail" ||
		flow != "payment/charge-1001|shipping/ship-1001|mail/shipped-1001" {
		t.Fatalf("charge-1001: title %q, dependents %q, workflow %q", title, dependents, flow)
	}
}
