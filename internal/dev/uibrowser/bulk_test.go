package uibrowser

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
)

// TestBrowserBulk: an operator filters a list, chooses every task matching it,
// previews a cancel (how many, by queue and by state, the finished ones
// skipped), confirms, and reads what was done. Screenshot "bulk" (the preview).
func TestBrowserBulk(t *testing.T) {
	t.Parallel()
	b := newBrowser(t, 1400, 900)
	e := newEnv(t)
	var tasks []outbox.Task
	for i := range 30 {
		tasks = append(tasks, outbox.Task{Queue: "orders", ID: fmt.Sprintf("order-%03d", i),
			Payload: []byte(fmt.Sprintf(`{"order_id":%d}`, 1000+i)), Delay: time.Duration(i+1) * time.Minute})
	}
	e.enqueue(t, tasks...)
	for i := range 3 {
		if ok, err := e.store.MarkDone(ctxT(t), e.pool, taskstate.Key{Queue: "orders", ID: fmt.Sprintf("order-%03d", i), Version: 1}, false); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}

	_, run := b.tab(t)
	var buf []byte
	var act, skip, skips, done, skipped string
	run(login(e),
		chromedp.Navigate(e.srv.URL+"/tasks"),
		chromedp.WaitVisible(`form.filters input[name="queue"]`, chromedp.ByQuery),
		chromedp.SendKeys(`form.filters input[name="queue"]`, "orders", chromedp.ByQuery),
		chromedp.Submit(`form.filters input[name="queue"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#bulk-all`, chromedp.ByQuery),
		chromedp.SetValue(`#bulk-action`, "cancel", chromedp.ByQuery),
		chromedp.Click(`#bulk-all`, chromedp.ByQuery),
		chromedp.Click(`#bulk-preview`, chromedp.ByQuery),
		chromedp.WaitVisible(`#preview`, chromedp.ByQuery),
		chromedp.Text(`#act-count`, &act, chromedp.ByQuery),
		chromedp.Text(`#skip-count`, &skip, chromedp.ByQuery),
		chromedp.Text(`#skips`, &skips, chromedp.ByQuery),
		b.screenshot("bulk", &buf),
	)
	if act != "27" || skip != "3" || skips != "3 skipped — done: only a pending or queued task can be cancelled" {
		t.Fatalf("preview: %q to cancel, %q skipped (%q)", act, skip, skips)
	}
	if r := e.row(t, "orders", "order-010"); r.State != taskstate.Pending {
		t.Fatalf("the preview changed a task: %+v", r)
	}
	run(chromedp.Click(`#bulk-confirm`, chromedp.ByQuery),
		chromedp.WaitVisible(`#result`, chromedp.ByQuery),
		chromedp.Text(`#done-count`, &done, chromedp.ByQuery),
		chromedp.Text(`#skipped-count`, &skipped, chromedp.ByQuery))
	if done != "27" || skipped != "3" {
		t.Fatalf("result: %q done, %q skipped", done, skipped)
	}
	for i := range 30 {
		want := taskstate.Cancelled
		if i < 3 {
			want = taskstate.Done
		}
		if r := e.row(t, "orders", fmt.Sprintf("order-%03d", i)); r.State != want {
			t.Errorf("order-%03d: %s, want %s", i, r.State, want)
		}
	}
}
