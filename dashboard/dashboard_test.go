package dashboard_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/dashboard"
	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// Mounted in a user's mux under a path, the dashboard serves its pages there,
// and its actions need the token.
func TestMountedInAServeMux(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	rdb, prefix := testenv.Redis(t)
	client, err := delayq.New(pool, rdb, delayq.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Outbox().Enqueue(t.Context(), pool, outbox.Task{Queue: "mail", ID: "m1", Payload: []byte(`{}`), Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := dashboard.New(nil, dashboard.Config{ReadOnly: true}); !errors.Is(err, dashboard.ErrInvalidConfig) {
		t.Errorf("a nil client: %v", err)
	}
	h, err := dashboard.New(client, dashboard.Config{Token: "a-token-of-24-bytes-long", BasePath: "/ops/delayq"})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/delayq/", h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/ops/delayq/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `<tr data-queue="mail">`) || !strings.Contains(string(body), `href="/ops/delayq/login"`) {
		t.Fatalf("%s\n%s", resp.Status, body)
	}
	resp, err = http.PostForm(srv.URL+"/ops/delayq/action/pause", map[string][]string{"queue": {"mail"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("unauthenticated pause: %s", resp.Status)
	}
}
