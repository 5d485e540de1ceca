package uibrowser

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
)

// The browser tests drive a headless Chromium (Debian's chromium package, which
// make browser installs) the way a person uses the dashboard. One browser
// process serves every test: each gets a tab of its own, one after the other.

// ScreenshotsEnv names the folder the browser tests write their screenshots to
// (default: delayq-ui-screenshots in the temporary directory).
const ScreenshotsEnv = "DELAYQ_UI_SCREENSHOTS"

func chromiumPath(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("DELAYQ_SKIP_BROWSER") != "" {
		t.Skip("no Chromium, and DELAYQ_SKIP_BROWSER is set")
	}
	t.Fatal("no Chromium: run `make browser` (Debian/Ubuntu: apt-get install chromium), or set DELAYQ_SKIP_BROWSER=1")
	return ""
}

func TestBrowser(t *testing.T) {
	t.Parallel()
	b := newBrowser(t, 1400, 900)
	t.Logf("screenshots in %s", b.shots)
	// One tab at a time: the tabs share the browser's cookies.
	t.Run("retry a dead task", func(t *testing.T) { b.retryDead(t) })
	t.Run("reschedule a task", func(t *testing.T) { b.reschedule(t) })
	t.Run("pause and resume a queue", func(t *testing.T) { b.pause(t) })
	t.Run("edit a dead task's payload and retry it", func(t *testing.T) { b.editRetry(t) })
}

type browser struct {
	ctx   context.Context
	shots string
}

// tab opens a tab that records every console error, uncaught exception and
// error log entry (CSP violations, failed loads); the test fails on any.
func (b *browser) tab(t *testing.T) (context.Context, func(...chromedp.Action)) {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.ctx)
	ctx, cancelT := context.WithTimeout(ctx, time.Minute)
	var mu sync.Mutex
	var problems []string
	chromedp.ListenTarget(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.APITypeError || ev.Type == runtime.APITypeWarning {
				var args []string
				for _, a := range ev.Args {
					args = append(args, string(a.Value))
				}
				problems = append(problems, fmt.Sprintf("console.%s: %s", ev.Type, strings.Join(args, " ")))
			}
		case *runtime.EventExceptionThrown:
			problems = append(problems, "exception: "+ev.ExceptionDetails.Text)
		case *log.EventEntryAdded:
			// A form refused with 422 shows its page again with the error: the
			// page's answer, not a failed load.
			refused := strings.Contains(ev.Entry.Text, "status of 422") && strings.Contains(ev.Entry.URL, "/action/")
			if (ev.Entry.Level == log.LevelError || ev.Entry.Level == log.LevelWarning) && !refused {
				problems = append(problems, fmt.Sprintf("log %s: %s %s", ev.Entry.Level, ev.Entry.Text, ev.Entry.URL))
			}
		}
	})
	// Each test logs in afresh: cookies do not tell ports apart, so an earlier
	// test's session on 127.0.0.1 would be sent to this test's server too.
	if err := chromedp.Run(ctx, log.Enable(), runtime.Enable(), network.ClearBrowserCookies()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancelT()
		cancel()
		mu.Lock()
		defer mu.Unlock()
		for _, p := range problems {
			t.Errorf("browser console: %s", p)
		}
	})
	run := func(actions ...chromedp.Action) {
		t.Helper()
		if err := chromedp.Run(ctx, actions...); err != nil {
			// Leave what the browser showed for the one who reads the failure.
			var url, html string
			sctx, cancelTab := chromedp.NewContext(b.ctx, chromedp.WithTargetID(chromedp.FromContext(ctx).Target.TargetID))
			defer cancelTab()
			sctx, cancel := context.WithTimeout(sctx, 5*time.Second)
			defer cancel()
			_ = chromedp.Run(sctx, chromedp.Location(&url), chromedp.OuterHTML("html", &html, chromedp.ByQuery, chromedp.AtLeast(0)))
			t.Fatalf("%v (at %s)\n%s", err, url, html)
		}
	}
	return ctx, run
}

func (b *browser) screenshot(name string, buf *[]byte) chromedp.Action {
	return chromedp.ActionFunc(func(ctx context.Context) error {
		if err := chromedp.FullScreenshot(buf, 100).Do(ctx); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(b.shots, name+".png"), *buf, 0o644)
	})
}

func login(e *env) chromedp.Tasks {
	return chromedp.Tasks{
		chromedp.Navigate(e.srv.URL + "/"),
		chromedp.Click(`#login`, chromedp.ByQuery),
		chromedp.WaitVisible(`#token`, chromedp.ByQuery),
		chromedp.SendKeys(`#token`, testToken, chromedp.ByQuery),
		chromedp.Click(`#login-submit`, chromedp.ByQuery),
		chromedp.WaitVisible(`table#queues`, chromedp.ByQuery),
	}
}

// An operator opens the queues page, finds the dead task, retries it, sees it
// run and leave the dead list.
func (b *browser) retryDead(t *testing.T) {
	e := newEnv(t)
	sys := e.runSystem(t, "mail")
	var tasks []outbox.Task
	for i := range 12 {
		tasks = append(tasks, outbox.Task{Queue: "mail", ID: fmt.Sprintf("welcome-%02d", i),
			Payload: []byte(fmt.Sprintf(`{"user_id":%d,"template":"welcome"}`, 1000+i))})
	}
	tasks = append(tasks, outbox.Task{Queue: "mail", ID: "order-42", Payload: []byte(`{"order_id":42,"kind":"fail"}`)})
	for i := range 8 {
		tasks = append(tasks, outbox.Task{Queue: "mail", ID: fmt.Sprintf("digest-%02d", i),
			Payload: []byte(`{"template":"digest"}`), Delay: time.Duration(i+1) * time.Hour})
	}
	e.enqueue(t, tasks...)
	e.waitState(t, "mail", "order-42", taskstate.Dead)
	e.waitState(t, "mail", "welcome-11", taskstate.Done)
	sys.fixed.Store(true)

	_, run := b.tab(t)
	var buf []byte
	var deadCount, rows, p50 string
	var bars int
	// The charts count a completion once the worker's batched acknowledgement
	// reached Redis, a moment after Postgres's commit: reload until they do.
	waitHour(t, e, "mail", 12)
	run(login(e),
		chromedp.Text(`tr[data-queue="mail"] a[data-count="dead"]`, &deadCount, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('tr[data-queue="mail"] + tr.bar svg.chart.throughput rect.bar').length`, &bars),
		chromedp.Text(`tr[data-queue="mail"] + tr.bar strong[data-p50]`, &p50, chromedp.ByQuery),
		b.screenshot("queues", &buf),
		chromedp.Click(`tr[data-queue="mail"] a[data-count="dead"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`tr[data-id="order-42"]`, chromedp.ByQuery),
		chromedp.Text(`tr[data-id="order-42"] td.err`, &rows, chromedp.ByQuery),
		b.screenshot("dead", &buf),
	)
	if deadCount != "1" || !strings.Contains(rows, "card declined: <b>not escaped?</b>") {
		t.Fatalf("dead count %q, error %q", deadCount, rows)
	}
	if bars < 1 || p50 == "" || p50 == "–" {
		t.Fatalf("charts: %d throughput bars, lateness p50 %q", bars, p50)
	}
	run(chromedp.Click(`tr[data-id="order-42"] button.retry`, chromedp.ByQuery),
		chromedp.WaitVisible(`p.flash`, chromedp.ByQuery))
	e.waitState(t, "mail", "order-42", taskstate.Done)
	var gone bool
	run(chromedp.Reload(),
		chromedp.WaitVisible(`main h1`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelector('tr[data-id="order-42"]') === null`, &gone))
	if !gone {
		t.Fatal("the retried task is still on the dead list")
	}
	var state string
	run(chromedp.Navigate(e.srv.URL+"/task?queue=mail&id=order-42"),
		chromedp.Text(`#pg-state`, &state, chromedp.ByQuery),
		b.screenshot("task", &buf))
	if state != "done" {
		t.Fatalf("task page: state %q", state)
	}
	if v, ok := sys.ran.Load("order-42"); !ok || v.(int) != 1 {
		t.Fatalf("the retry did not run once as attempt 1: %v", v)
	}
	run(chromedp.Navigate(e.srv.URL+"/tasks?queue=mail"),
		chromedp.WaitVisible(`table#tasks`, chromedp.ByQuery),
		b.screenshot("tasks", &buf))
}

// An operator reschedules a task from its page: a new version, due later.
func (b *browser) reschedule(t *testing.T) {
	e := newEnv(t)
	e.enqueue(t, outbox.Task{Queue: "report", ID: "monthly-2026-11", Payload: []byte(`{"month":"2026-11"}`), Delay: time.Hour})
	_, run := b.tab(t)
	var version, flash string
	run(login(e),
		chromedp.Navigate(e.srv.URL+"/task?queue=report&id=monthly-2026-11"),
		chromedp.WaitVisible(`#when`, chromedp.ByQuery),
		chromedp.SendKeys(`#when`, "3h", chromedp.ByQuery),
		chromedp.Click(`#reschedule`, chromedp.ByQuery),
		chromedp.WaitVisible(`p.flash`, chromedp.ByQuery),
		chromedp.Text(`p.flash`, &flash, chromedp.ByQuery),
		chromedp.Text(`#pg-version`, &version, chromedp.ByQuery),
	)
	if version != "2" || !strings.Contains(flash, "rescheduled") {
		t.Fatalf("after reschedule: version %q, flash %q", version, flash)
	}
	row, _, err := e.browse.Task(ctxT(t), e.pool, "report", "monthly-2026-11", 0)
	if err != nil || time.Until(row.RunAt) < 2*time.Hour+50*time.Minute {
		t.Fatalf("run_at %v (%v)", row.RunAt, err)
	}
}

// waitHour waits until the queues page counts at least n tasks done in queue's
// last hour (the history follows the commits by a batched acknowledgement).
func waitHour(t *testing.T, e *env, queue string, n int) {
	t.Helper()
	re := regexp.MustCompile(`<tr data-queue="` + regexp.QuoteMeta(queue) + `">[\s\S]*?data-done-hour="(\d+)"`)
	c := e.client(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, body := c.get("/")
		if m := re.FindStringSubmatch(body); m != nil {
			if got, _ := strconv.Atoi(m[1]); got >= n {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queues page never counted %d done in %s:\n%s", n, queue, body)
		}
		time.Sleep(50 * time.Millisecond) // polling the page: no signal to wait on from outside
	}
}

// An operator pauses a queue from the queues page, sees it paused in both stores,
// and resumes it.
func (b *browser) pause(t *testing.T) {
	e := newEnv(t)
	e.enqueue(t, outbox.Task{Queue: "billing", ID: "invoice-1", Payload: []byte(`{}`), Delay: time.Hour})
	_, run := b.tab(t)
	var flash, badge string
	run(login(e),
		chromedp.Click(`tr[data-queue="billing"] button.pause`, chromedp.ByQuery),
		chromedp.WaitVisible(`p.flash`, chromedp.ByQuery),
		chromedp.Text(`p.flash`, &flash, chromedp.ByQuery),
		chromedp.Text(`tr[data-queue="billing"] [data-paused]`, &badge, chromedp.ByQuery),
	)
	if !strings.Contains(flash, "paused") || badge != "paused" {
		t.Fatalf("after pause: flash %q, badge %q", flash, badge)
	}
	if p, err := e.redisPaused(t, "billing"); err != nil || !p {
		t.Fatalf("Redis: paused %v %v", p, err)
	}
	run(chromedp.Click(`tr[data-queue="billing"] button.resume`, chromedp.ByQuery),
		chromedp.WaitVisible(`tr[data-queue="billing"] button.pause`, chromedp.ByQuery),
		chromedp.Text(`tr[data-queue="billing"] [data-paused]`, &badge, chromedp.ByQuery))
	if badge != "running" {
		t.Fatalf("after resume: %q", badge)
	}
	if p, err := e.redisPaused(t, "billing"); err != nil || p {
		t.Fatalf("Redis after resume: paused %v %v", p, err)
	}
}

// An operator fixes a dead task's payload on its page and retries it: a new
// version runs with the edited payload.
func (b *browser) editRetry(t *testing.T) {
	e := newEnv(t)
	sys := e.runSystem(t, "mail")
	e.enqueue(t, outbox.Task{Queue: "mail", ID: "invite-7", Payload: []byte(`{"to":"fail@example.com","template":"invite"}`)})
	e.waitState(t, "mail", "invite-7", taskstate.Dead)
	_, run := b.tab(t)
	var buf []byte
	var flash string
	run(login(e),
		chromedp.Navigate(e.srv.URL+"/task?queue=mail&id=invite-7"),
		chromedp.WaitVisible(`#edit-payload`, chromedp.ByQuery),
		chromedp.SetValue(`#edit-payload`, "{\n  \"to\": \"ann@example.com\",\n  \"template\": \"invite\"\n}", chromedp.ByQuery),
		b.screenshot("edit", &buf),
		chromedp.Click(`#edit-retry`, chromedp.ByQuery),
		chromedp.WaitVisible(`p.flash`, chromedp.ByQuery),
		chromedp.Text(`p.flash`, &flash, chromedp.ByQuery),
	)
	if !strings.Contains(flash, "edited payload") {
		t.Fatalf("flash %q", flash)
	}
	e.waitState(t, "mail", "invite-7", taskstate.Done)
	var state, version, payload string
	run(chromedp.Reload(),
		chromedp.Text(`#pg-state`, &state, chromedp.ByQuery),
		chromedp.Text(`#pg-version`, &version, chromedp.ByQuery),
		chromedp.Text(`#payload pre`, &payload, chromedp.ByQuery))
	if state != "done" || version != "2" || !strings.Contains(payload, "ann@example.com") {
		t.Fatalf("after the edited retry: %s v%s, payload %q", state, version, payload)
	}
	if _, ok := sys.ran.Load("invite-7"); !ok {
		t.Fatal("the edited task did not run")
	}
}

// newBrowser starts a headless Chromium of the test's own, its window width × height,
// stopped when the test ends; screenshots go to $DELAYQ_UI_SCREENSHOTS (ScreenshotsEnv).
func newBrowser(t *testing.T, width, height int) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.WindowSize(width, height),
		chromedp.Flag("disable-dev-shm-usage", true),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	if err := chromedp.Run(bctx); err != nil {
		cancelBrowser()
		cancelAlloc()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
	})
	shots := os.Getenv(ScreenshotsEnv)
	if shots == "" {
		shots = filepath.Join(os.TempDir(), "delayq-ui-screenshots")
	}
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	return &browser{ctx: bctx, shots: shots}
}
