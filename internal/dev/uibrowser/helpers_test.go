package uibrowser

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/internal/ui"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// The helpers below are the part of internal/ui's test helpers the browser
// tests use, on the package's exported API.

func TestMain(m *testing.M) { testenv.Main(m) }

const testToken = "test-token-0123456789abcdef"

// env is one test's servers, clients and dashboard.
type env struct {
	pool   *pgxpool.Pool
	dq     *dispatch.Client
	ob     *outbox.Client
	store  *taskstate.Store
	browse *taskstate.Browse
	srv    *httptest.Server
}

func newEnv(t *testing.T) *env {
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
	h, err := ui.New(ui.Config{DB: pool, Redis: dq, Outbox: ob, Token: testToken, PageSize: 5})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	tc := taskstate.Config{Schema: "public"}
	return &env{pool: pool, dq: dq, ob: ob, store: taskstate.New(tc), browse: taskstate.NewBrowser(tc), srv: srv}
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

func (e *env) row(t *testing.T, queue, id string) taskstate.RowState {
	t.Helper()
	r, err := e.store.Row(ctxT(t), e.pool, queue, id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// waitState waits until queue/id is in state st in Postgres.
func (e *env) waitState(t *testing.T, queue, id string, st taskstate.State) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := e.row(t, queue, id)
		if r.Exists && r.State == st {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/%s: %+v, want %s", queue, id, r, st)
		}
		time.Sleep(20 * time.Millisecond) // polling the truth: no signal to wait on from outside
	}
}

// redisPaused reports whether Redis holds queue paused (what the claim script reads).
func (e *env) redisPaused(t *testing.T, queue string) (bool, error) {
	t.Helper()
	ctl, _, err := e.dq.Controls(ctxT(t), queue)
	return ctl.Paused, err
}

// client is a browser-like HTTP client: a cookie jar, no redirects followed.
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

func (c *client) get(path string) (*http.Response, string) {
	c.t.Helper()
	resp, err := c.http.Get(c.e.srv.URL + path)
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

// system runs a relay and a worker on queue for the rest of the test. Tasks
// whose payload holds "fail" die at once until fixed is set.
type system struct {
	fixed atomic.Bool
	ran   sync.Map // id -> attempts
}

func (e *env) runSystem(t *testing.T, queue string) *system {
	t.Helper()
	s := &system{}
	rl, err := relay.New(e.pool, e.dq.AsRedis(), relay.Config{PollInterval: 50 * time.Millisecond, ReapInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w, err := clientkit.NewClient(e.pool, e.dq, e.ob, delayq.WorkerConfig{Lease: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = w.HandleTx(queue, func(ctx context.Context, tx pgx.Tx, task *delayq.Task) error {
		if strings.Contains(string(task.Payload), "fail") && !s.fixed.Load() {
			return delayq.NoRetry(errors.New("card declined: <b>not escaped?</b>"))
		}
		s.ran.Store(task.ID, task.Attempt)
		return nil
	}, delayq.QueueConfig{Concurrency: 2})
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
	return s
}
