package ui

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const testToken = "test-token-0123456789abcdef"

// env is one test's servers, clients and dashboard.
type env struct {
	pool  *pgxpool.Pool
	dq    *dispatch.Client
	ob    *outbox.Client
	store *taskstate.Store
	h     *Handler
	srv   *httptest.Server
}

func newEnv(t *testing.T, mod func(*Config)) *env {
	t.Helper()
	pool := testenv.Postgres(t)
	rdb, prefix := testenv.Redis(t)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix, ReapBackoffBase: time.Millisecond, ReapBackoffMax: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{DB: pool, Redis: dq, Outbox: ob, Token: testToken, PageSize: 5}
	if mod != nil {
		mod(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &env{pool: pool, dq: dq, ob: ob, store: taskstate.New(taskstate.Config{Schema: "public"}), h: h, srv: srv}
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// enqueue commits tasks into the outbox.
func (e *env) enqueue(t *testing.T, tasks ...outbox.Task) {
	t.Helper()
	if _, err := e.ob.EnqueueMany(ctxT(t), e.pool, tasks); err != nil {
		t.Fatal(err)
	}
}

// kill makes version 1 of queue/id dead in Postgres, as a worker's last failure.
func (e *env) kill(t *testing.T, queue, id, why string) {
	t.Helper()
	ok, err := e.store.RecordFailure(ctxT(t), e.pool, taskstate.Failure{
		Key: taskstate.Key{Queue: queue, ID: id, Version: 1}, Attempt: 1, Err: why, Dead: true})
	if err != nil || !ok {
		t.Fatalf("kill %s/%s: %v %v", queue, id, ok, err)
	}
}

func (e *env) row(t *testing.T, queue, id string) taskstate.RowState {
	t.Helper()
	r, err := e.store.Row(ctxT(t), e.pool, queue, id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// client is a browser-like HTTP client: a cookie jar, no redirects followed
// unless asked.
type client struct {
	t    *testing.T
	e    *env
	http *http.Client
}

func (e *env) client(t *testing.T) *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: t, e: e, http: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (c *client) do(req *http.Request) (*http.Response, string) {
	c.t.Helper()
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp, string(b)
}

func (c *client) get(path string) (*http.Response, string) {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.e.srv.URL+path, nil)
	return c.do(req)
}

// post sends a form as the dashboard's own page would (same origin).
func (c *client) post(path string, form url.Values) (*http.Response, string) {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.e.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	return c.do(req)
}

func (c *client) login() {
	c.t.Helper()
	resp, _ := c.post("/login", url.Values{"token": {testToken}})
	if resp.StatusCode != http.StatusSeeOther {
		c.t.Fatalf("login: %s", resp.Status)
	}
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// csrf reads the CSRF token from a page.
func (c *client) csrf(path string) string {
	c.t.Helper()
	_, body := c.get(path)
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		c.t.Fatalf("no CSRF token on %s:\n%s", path, body)
	}
	return m[1]
}

// act posts an action with the CSRF token and expects the redirect of success.
func (c *client) act(action string, form url.Values) string {
	c.t.Helper()
	form.Set("csrf", c.csrf("/consistency"))
	resp, body := c.post("/action/"+action, form)
	if resp.StatusCode != http.StatusSeeOther {
		c.t.Fatalf("%s: %s\n%s", action, resp.Status, body)
	}
	return resp.Header.Get("Location")
}

// runSystem runs a relay and a worker that completes every task of queue, for
// the rest of the test.
func (e *env) runSystem(t *testing.T, queue string) {
	t.Helper()
	rl, err := relay.New(e.pool, e.dq.AsRedis(), relay.Config{PollInterval: 50 * time.Millisecond, ReapInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w, err := clientkit.NewClient(e.pool, e.dq, e.ob, delayq.WorkerConfig{Lease: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = w.HandleTx(queue, func(context.Context, pgx.Tx, *delayq.Task) error { return nil }, delayq.QueueConfig{Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = rl.Run(ctx) })
	wg.Go(func() { _ = w.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

func newRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }

func mustReq(path string) *http.Request { return httptest.NewRequest(http.MethodGet, path, nil) }

// redisPaused reports whether Redis holds queue paused (what the claim script reads).
func (e *env) redisPaused(t *testing.T, queue string) (bool, error) {
	t.Helper()
	ctl, _, err := e.dq.Controls(ctxT(t), queue)
	return ctl.Paused, err
}
