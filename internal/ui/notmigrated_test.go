package ui

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

// TestNotMigratedPage: on a database whose migrations have not run, every page
// shows the same clear page (503) with the command that fixes it, not
// PostgreSQL's raw error. (The consistency page reads nothing until a check
// runs; the check, an action, fails through the same page.)
func TestNotMigratedPage(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t, testenv.EmptyPostgresURL(t))
	rdb, prefix := testenv.Redis(t)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(Config{DB: pool, Redis: dq, Outbox: ob, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for _, path := range []string{"/", "/tasks?queue=q", "/tasks?queue=q&state=queued", "/task?queue=q&id=x", "/dead"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		s := string(body)
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(s, "<h1>Not migrated</h1>") ||
			!strings.Contains(s, "delayq migrate up") || !strings.Contains(s, `table &#34;public.delayq_`) ||
			strings.Contains(s, "SQLSTATE") || strings.Contains(s, "does not exist") {
			t.Errorf("GET %s: %d\n%s", path, resp.StatusCode, s)
		}
	}
}
