package dashboard_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/dashboard"
	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

const testToken = "a-token-of-24-bytes-long"

// browser is an HTTP client with a cookie jar that follows no redirect and
// posts forms as the dashboard's own pages would (same origin).
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newBrowser(t *testing.T, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, c: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *browser) do(method, path string, form url.Values) (*http.Response, string) {
	b.t.Helper()
	req, _ := http.NewRequest(method, b.base+path, strings.NewReader(form.Encode()))
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return resp, string(body)
}

var (
	csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)
	cellRE = regexp.MustCompile(`data-count="([a-z_]+)">(\d+)<`)
)

// row is the overview's row that starts with marker, "" if there is none.
func row(page, marker string) string {
	start := strings.Index(page, marker)
	if start < 0 {
		return ""
	}
	return page[start : start+strings.Index(page[start:], "</tr>")]
}

// counts reads the nonzero counts of the overview's row that starts with
// marker.
func counts(page, marker string) string {
	var out []string
	for _, m := range cellRE.FindAllStringSubmatch(row(page, marker), -1) {
		if n, _ := strconv.Atoi(m[2]); n != 0 {
			out = append(out, m[1]+"="+m[2])
		}
	}
	return strings.Join(out, " ")
}

// One dashboard over two databases: the overview shows each database's queues
// and the totals; a database's own pages and actions are that database's alone;
// the security of one dashboard holds on every page.
func TestSeveralDatabases(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rdb, prefix := testenv.Redis(t)
	clients := map[string]*delayq.Client{}
	var list []*delayq.Client
	for _, key := range []string{"eu1", "us1"} {
		c, err := delayq.New(testenv.Postgres(t), rdb, delayq.Config{Prefix: prefix, Database: key})
		if err != nil {
			t.Fatal(err)
		}
		clients[key] = c
		list = append(list, c)
	}
	enqueue := func(key string, tasks ...outbox.Task) {
		t.Helper()
		c := clients[key]
		if _, err := c.Outbox().EnqueueMany(ctx, c.DB(), tasks); err != nil {
			t.Fatal(err)
		}
	}
	later := func(queue, id string) outbox.Task {
		return outbox.Task{Queue: queue, ID: id, Payload: []byte(`{}`), Delay: time.Hour}
	}
	// eu1: mail m1 and m2, pay p1 cancelled; us1: mail m1 (the same id, another
	// task) and m3, sms s1, and a task ready in Redis under PREFIX:us1.
	enqueue("eu1", later("mail", "m1"), later("mail", "m2"), later("pay", "p1"))
	if err := clients["eu1"].Outbox().Cancel(ctx, clients["eu1"].DB(), "pay", "p1"); err != nil {
		t.Fatal(err)
	}
	enqueue("us1", later("mail", "m1"), later("mail", "m3"), later("sms", "s1"))
	usDQ, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix + ":us1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := usDQ.Enqueue(ctx, "sms", dispatch.Task{ID: "r1"}); err != nil {
		t.Fatal(err)
	}

	// Bad input: refused, nothing served.
	noKey, err := delayq.New(testenv.Postgres(t), rdb, delayq.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]dashboard.Config{
		"no database":   {ReadOnly: true, Databases: nil},
		"a nil client":  {ReadOnly: true, Databases: []*delayq.Client{list[0], nil}},
		"no key":        {ReadOnly: true, Databases: []*delayq.Client{list[0], noKey}},
		"a key twice":   {ReadOnly: true, Databases: []*delayq.Client{list[0], list[1], list[0]}},
		"no credential": {Databases: list},
	} {
		if h, err := dashboard.New(nil, cfg); !errors.Is(err, dashboard.ErrInvalidConfig) || h != nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want ErrInvalidConfig in one line and no handler", name, err)
		}
	}
	if _, err := dashboard.New(list[0], dashboard.Config{ReadOnly: true, Databases: list}); !errors.Is(err, dashboard.ErrInvalidConfig) {
		t.Errorf("a client and Databases: %v", err)
	}
	if _, err := dashboard.New(nil, dashboard.Config{ReadOnly: true, Databases: list[1:]}); err != nil {
		t.Errorf("one database: %v", err)
	}
	// A keyed client on a dashboard of its own reads its keys under PREFIX:KEY.
	one, err := dashboard.New(list[1], dashboard.Config{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	one.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	if !strings.Contains(w.Body.String(), `data-count="redis_ready">1<`) {
		t.Errorf("us1's dashboard of its own shows no ready task:\n%s", w.Body.String())
	}

	h, err := dashboard.New(nil, dashboard.Config{Token: testToken, BasePath: "/ops", Databases: list})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/", h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	b := newBrowser(t, srv.URL)

	resp, page := b.do(http.MethodGet, "/ops/", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("overview: %s\n%s", resp.Status, page)
	}
	for marker, want := range map[string]string{
		`<tr data-db="eu1" data-queue="mail">`:            "pending=2",
		`<tr data-db="eu1" data-queue="pay">`:             "cancelled=1",
		`<tr data-db="us1" data-queue="mail">`:            "pending=2",
		`<tr data-db="us1" data-queue="sms">`:             "pending=1 redis_ready=1 redis_due_now=1",
		`<tr class="total" data-total data-queue="mail">`: "pending=4",
		`<tr class="total" data-total data-queue="pay">`:  "cancelled=1",
		`<tr class="total" data-total data-queue="sms">`:  "pending=1 redis_ready=1 redis_due_now=1",
		`<tr class="total all" data-total-all>`:           "pending=5 cancelled=1 redis_ready=1 redis_due_now=1",
	} {
		if got := counts(page, marker); got != want {
			t.Errorf("overview row %s: %q, want %q", marker, got, want)
		}
	}
	for _, bad := range []string{`data-db="eu1" data-queue="sms"`, `data-db="us1" data-queue="pay"`} {
		if strings.Contains(page, bad) {
			t.Errorf("overview has a row %s", bad)
		}
	}
	for _, want := range []string{`href="/ops/db/eu1/"`, `href="/ops/db/us1/tasks?queue=sms"`, `href="/ops/login"`} {
		if !strings.Contains(page, want) {
			t.Errorf("overview lacks %s", want)
		}
	}

	// Each database's pages, under its path, on its own stores.
	for path, code := range map[string]int{
		"/ops/db/us1/task?queue=sms&id=s1": 200, "/ops/db/eu1/task?queue=sms&id=s1": 404,
		"/ops/db/eu1/": 200, "/ops/db/us1/dead": 200, "/ops/db/us1/workers": 200, "/ops/db/eu1/consistency": 200,
		"/ops/db/eu1": 301, "/ops/db/xx1/": 404, "/ops/db/": 404, "/ops/db/eu1/static/style.css": 200,
	} {
		resp, body := b.do(http.MethodGet, path, nil)
		if resp.StatusCode != code {
			t.Errorf("GET %s: %s, want %d", path, resp.Status, code)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
			t.Errorf("GET %s: CSP %q", path, csp)
		}
		if code == 200 && !strings.HasSuffix(path, ".css") && (!strings.Contains(body, `id="database"`) || strings.Contains(body, "<script")) {
			t.Errorf("GET %s: no database badge, or a script:\n%s", path, body)
		}
	}
	if _, body := b.do(http.MethodGet, "/ops/db/us1/", nil); !strings.Contains(body, `<tr data-queue="sms">`) || strings.Contains(body, `<tr data-queue="pay">`) ||
		!strings.Contains(body, `href="/ops/db/us1/tasks?queue=sms"`) || !strings.Contains(body, `id="overview" href="/ops/"`) {
		t.Errorf("us1's queues page:\n%s", body)
	}

	// Actions need authentication, and a database's own CSRF token.
	eu1CSRF := func() string {
		_, body := b.do(http.MethodGet, "/ops/db/eu1/consistency", nil)
		m := csrfRE.FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("no CSRF token on eu1's page:\n%s", body)
		}
		return m[1]
	}
	if resp, _ := b.do(http.MethodPost, "/ops/db/eu1/action/pause", url.Values{"queue": {"mail"}}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("pause before logging in: %s", resp.Status)
	}
	if resp, _ := b.do(http.MethodPost, "/ops/login", url.Values{"token": {testToken}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %s", resp.Status)
	}
	csrf := eu1CSRF() // logged in at the overview: the login holds under every database
	if resp, _ := b.do(http.MethodPost, "/ops/db/us1/action/pause", url.Values{"queue": {"mail"}, "csrf": {csrf}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("eu1's CSRF token on us1: %s", resp.Status)
	}
	if resp, body := b.do(http.MethodPost, "/ops/db/eu1/action/pause", url.Values{"queue": {"mail"}, "csrf": {csrf}}); resp.StatusCode != http.StatusSeeOther ||
		!strings.HasPrefix(resp.Header.Get("Location"), "/ops/db/eu1/") {
		t.Fatalf("pause on eu1: %s %q\n%s", resp.Status, resp.Header.Get("Location"), body)
	}
	if resp, body := b.do(http.MethodPost, "/ops/db/us1/action/cancel", url.Values{"queue": {"mail"}, "id": {"m1"}, "csrf": {csrf}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("cancel on us1 with eu1's token: %s\n%s", resp.Status, body)
	}
	paused := func(key string) bool {
		qs, err := clients[key].Queues(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if q.Queue == "mail" {
				return q.Paused
			}
		}
		return false
	}
	if !paused("eu1") || paused("us1") {
		t.Errorf("mail paused: eu1 %v, us1 %v; want eu1's alone", paused("eu1"), paused("us1"))
	}
	_, page = b.do(http.MethodGet, "/ops/", nil)
	if !strings.Contains(row(page, `<tr data-db="eu1" data-queue="mail">`), `data-paused="true"`) ||
		!strings.Contains(row(page, `<tr data-db="us1" data-queue="mail">`), `data-paused="false"`) {
		t.Errorf("overview's pauses:\n%s", page)
	}
	// Logging out at a database's page logs out of every one.
	if resp, _ := b.do(http.MethodPost, "/ops/db/us1/logout", url.Values{}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %s", resp.Status)
	}
	if resp, _ := b.do(http.MethodPost, "/ops/db/eu1/action/resume", url.Values{"queue": {"mail"}, "csrf": {csrf}}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("resume after logging out: %s", resp.Status)
	}
}
