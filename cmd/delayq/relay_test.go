package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

// relayOut is a buffer safe to read while the command writes to it.
type relayOut struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *relayOut) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *relayOut) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

func runRelayCmd(ctx context.Context, env map[string]string, args ...string) (code int, stdout, stderr *relayOut) {
	stdout, stderr = &relayOut{}, &relayOut{}
	m := NewMain(stdout, stderr, func(k string) string { return env[k] })
	return m.Run(ctx, append([]string{"relay"}, args...)), stdout, stderr
}

// Bad input gets one line on standard error and the right exit code, without
// a password; --help documents every flag with its default.
func TestRelayCommandBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		want string
	}{
		{"malformed database URL", map[string]string{"REDIS_URL": "redis://127.0.0.1:1"},
			[]string{"--database-url", "postgres://u:secret@[oops"}, exitUsage, "malformed PostgreSQL URL"},
		{"malformed redis URL", nil,
			[]string{"--database-url", testenv.PostgresURL(t), "--redis-url", "redis://u:secret@h:notaport"}, exitUsage, "malformed Redis URL"},
		{"unreachable database", map[string]string{"DATABASE_URL": "postgres://u:secret@127.0.0.1:1/db", "REDIS_URL": "redis://127.0.0.1:1"},
			nil, exitFailure, "unreachable"},
		{"no database URL", nil, nil, exitUsage, "no PostgreSQL URL"},
		{"bad batch", nil, []string{"--batch", "0"}, exitUsage, "--batch 0"},
		{"bad horizon", nil, []string{"--horizon", "-5s"}, exitUsage, "--horizon"},
		{"bad repair rate", nil, []string{"--repair-rate", "-1"}, exitUsage, "--repair-rate -1"},
		{"bad queue", nil, []string{"--queues", "ok,not ok"}, exitUsage, "invalid queue name"},
		{"bad log format", nil, []string{"--log-format", "xml"}, exitUsage, "--log-format"},
		{"unknown flag", nil, []string{"--nope"}, exitUsage, "nope"},
		{"argument", nil, []string{"extra"}, exitUsage, "unexpected argument"},
		{"dashboard without credentials", nil, []string{"--ui"}, exitUsage, "--ui: actions need DELAYQ_UI_TOKEN"},
		{"dashboard with a short token", map[string]string{"DELAYQ_UI_TOKEN": "short"}, []string{"--ui"}, exitUsage, "at least 16 bytes"},
		{"dashboard without a listener", nil, []string{"--ui", "--listen", ""}, exitUsage, "--listen address, which is empty"},
		{"read-only dashboard alone", nil, []string{"--ui-read-only"}, exitUsage, "only with --ui"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		code, stdout, stderr := runRelayCmd(ctx, tc.env, tc.args...)
		cancel()
		errOut := stderr.String()
		if code != tc.code || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 ||
			!strings.HasPrefix(errOut, "delayq relay: ") || strings.Contains(errOut, "secret") || stdout.String() != "" {
			t.Errorf("%s: exit %d, stderr %q, stdout %q; want exit %d and one line with %q, no password",
				tc.name, code, errOut, stdout.String(), tc.code, tc.want)
		}
	}

	code, stdout, stderr := runRelayCmd(context.Background(), nil, "--help")
	help := stdout.String()
	if code != exitOK || stderr.String() != "" {
		t.Errorf("--help: exit %d, stderr %q", code, stderr.String())
	}
	for _, want := range []string{
		"-database-url", "DATABASE_URL", "-redis-url", "REDIS_URL", "-schema", `(default "public")`,
		"-prefix", `(default "dq")`, "-horizon", "(default 1h0m0s)", "-batch", "(default 1000)",
		"-reap-interval", "(default 1s)", "-retention", "(default 168h0m0s)", "-listen",
		`(default "127.0.0.1:9090")`, "-queues", "-log-format", `(default "text")`, "-poll-interval", "(default 5s)",
	} {
		if !strings.Contains(help, want) {
			t.Errorf("--help lacks %q:\n%s", want, help)
		}
	}
}

// The command relays a committed row, serves /readyz and /metrics, and exits 0
// when its context ends (SIGTERM or SIGINT in main).
func TestRelayCommandRuns(t *testing.T) {
	t.Parallel()
	dbURL := testenv.PostgresURL(t)
	_, prefix := testenv.Redis(t)
	env := map[string]string{"DATABASE_URL": dbURL, "REDIS_URL": testenv.RedisURL(t)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, stderr := &relayOut{}, &relayOut{}
	done := make(chan int, 1)
	go func() {
		m := NewMain(stdout, stderr, func(k string) string { return env[k] })
		done <- m.Run(ctx, []string{"relay", "--listen", "127.0.0.1:0", "--prefix", prefix, "--log-format", "json"})
	}()

	// The admin address is in the start line.
	addrRE := regexp.MustCompile(`"admin":"(http://127\.0\.0\.1:\d+)"`)
	var admin string
	relayWaitFor(t, 30*time.Second, func() bool {
		if m := addrRE.FindStringSubmatch(stderr.String()); m != nil {
			admin = m[1]
			return true
		}
		select {
		case code := <-done:
			t.Fatalf("relay exited %d: %s", code, stderr.String())
		default:
		}
		return false
	})

	pool := testenv.Pool(t, dbURL)
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Enqueue(context.Background(), pool, outbox.Task{Queue: "q", ID: "cli-1", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	relayWaitFor(t, 10*time.Second, func() bool {
		var state string
		err := pool.QueryRow(context.Background(), `SELECT state FROM delayq_outbox WHERE task_id = 'cli-1'`).Scan(&state)
		return err == nil && state == "queued"
	})

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	get := func(path string) (int, string) {
		resp, err := client.Get(admin + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// consistency: ok, or degraded while the first self-healing pass runs (a
	// fresh Redis has no epoch mark yet).
	if code, body := get("/readyz"); code != http.StatusOK || !strings.HasPrefix(body, "consistency: ") ||
		!strings.HasSuffix(body, "\npostgres: ok\nredis: ok\n") {
		t.Errorf("/readyz: %d %q", code, body)
	}
	// The relay counts a round's rows after its commit, which the row's state
	// shows first: wait for the count.
	var code int
	var body string
	relayWaitFor(t, 10*time.Second, func() bool {
		code, body = get("/metrics")
		return code == http.StatusOK && strings.Contains(body, `delayq_relay_rows_total{result="added"} 1`)
	})
	if !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics: %d, lacks the Go metrics:\n%s", code, body)
	}

	cancel() // what SIGTERM does through main's signal-aware context
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("exit %d after shutdown, want 0; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop within 30s of shutdown")
	}
	if !strings.Contains(stderr.String(), `"msg":"relay: stopped"`) {
		t.Errorf("no stop line in:\n%s", stderr.String())
	}
	if _, err := client.Get(admin + "/healthz"); err == nil {
		t.Errorf("admin server still answers after shutdown")
	}
}

// relayWaitFor polls cond every 10ms until it holds or fails the test after timeout.
func relayWaitFor(t *testing.T, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// delayq relay --ui serves the dashboard under /ui/ on its admin listener, with
// the same authentication as delayq ui: pages for all, actions for the token.
func TestRelayCommandServesUI(t *testing.T) {
	t.Parallel()
	dbURL := testenv.PostgresURL(t)
	_, prefix := testenv.Redis(t)
	const token = "relay-ui-token-0123456789"
	env := map[string]string{"DATABASE_URL": dbURL, "REDIS_URL": testenv.RedisURL(t), "DELAYQ_UI_TOKEN": token}
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &relayOut{}, &relayOut{}
	done := make(chan int, 1)
	go func() {
		m := NewMain(stdout, stderr, func(k string) string { return env[k] })
		done <- m.Run(ctx, []string{"relay", "--ui", "--listen", "127.0.0.1:0", "--prefix", prefix, "--log-format", "json"})
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("relay exited %d: %s", code, stderr.String())
		}
	})
	addrRE := regexp.MustCompile(`"admin":"(http://127\.0\.0\.1:\d+)"`)
	var admin string
	relayWaitFor(t, 30*time.Second, func() bool {
		if m := addrRE.FindStringSubmatch(stderr.String()); m != nil {
			admin = m[1]
			return true
		}
		return false
	})
	pool := testenv.Pool(t, dbURL)
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Enqueue(context.Background(), pool, outbox.Task{Queue: "mail", ID: "m1", Payload: []byte(`{}`), Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(admin + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `<tr data-queue="mail">`) ||
		!strings.Contains(string(body), `href="/ui/login"`) || resp.Header.Get("Content-Security-Policy") == "" {
		t.Fatalf("/ui/: %s\n%s", resp.Status, body)
	}
	resp, err = client.PostForm(admin+"/ui/action/pause", map[string][]string{"queue": {"mail"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("pause without credentials: %s", resp.Status)
	}
	req, _ := http.NewRequest(http.MethodPost, admin+"/ui/action/pause", strings.NewReader("queue=mail"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/?ok=paused" {
		t.Errorf("pause with the token: %s %q", resp.Status, resp.Header.Get("Location"))
	}
}
