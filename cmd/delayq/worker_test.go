package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

// workerOut is a buffer safe to read while the command writes to it.
type workerOut struct {
	mu sync.Mutex
	b  strings.Builder
}

func (o *workerOut) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *workerOut) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

func runWorkerCmd(ctx context.Context, env map[string]string, args ...string) (code int, stdout, stderr *workerOut) {
	stdout, stderr = &workerOut{}, &workerOut{}
	m := NewMain(stdout, stderr, func(k string) string { return env[k] })
	return m.Run(ctx, append([]string{"worker"}, args...)), stdout, stderr
}

// --help documents the flags and the command's contract; bad flags are usage
// errors on one line, before any connection.
func TestWorkerCommandUsage(t *testing.T) {
	t.Parallel()
	code, out, _ := runWorkerCmd(context.Background(), nil, "--help")
	if code != exitOK {
		t.Fatalf("--help: exit %d", code)
	}
	for _, want := range []string{"-exec", "-queue", "-concurrency", "-lease", "-heartbeat", "-dead-exit-code", "-max-attempts",
		"-backoff-base", "-backoff-max", "-shutdown-timeout", "-clear-payload", "-listen", "DELAYQ_TASK_ID", "standard input", "at-least-once",
		"-weights", "-strict", "-transactional", "DELAYQ_RETRY_AFTER_FILE", "delayq_complete"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help does not mention %s", want)
		}
	}
	env := map[string]string{"DATABASE_URL": "postgres://u:secret@127.0.0.1:1/db", "REDIS_URL": "redis://127.0.0.1:1"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--queue", "q"}, "--exec is required"},
		{[]string{"--exec", "true"}, "--queue is required"},
		{[]string{"--exec", "true", "--queue", "bad{q}"}, "--queue"},
		{[]string{"--exec", "true", "--queue", "q", "--concurrency", "0"}, "--concurrency 0"},
		{[]string{"--exec", "true", "--queue", "q", "--concurrency", "1001"}, "Concurrency"},
		{[]string{"--exec", "true", "--queue", "q", "--max-attempts", "-1"}, "MaxAttempts"},
		{[]string{"--exec", "true", "--queue", "q", "--lease", "1s", "--heartbeat", "2s"}, "HeartbeatInterval"},
		{[]string{"--exec", "true", "--queue", "q", "--backoff-base", "-1s"}, "--backoff-base"},
		{[]string{"--exec", "true", "--queue", "q", "--dead-exit-code", "300"}, "--dead-exit-code"},
		{[]string{"--exec", "true", "--queue", "q", "extra"}, "unexpected argument"},
		{[]string{"--exec", "true", "--queue", "q", "--strict"}, "--strict needs --weights"},
		{[]string{"--exec", "true", "--queue", "q", "--transactional", "--clear-payload"}, "delayq.clear_payload_on_done"},
		{[]string{"--exec", "true", "--queue", "a,b", "--weights", "a=2"}, `no weight for queue "b"`},
		{[]string{"--exec", "true", "--queue", "a", "--weights", "a=2,b=1"}, "not in --queue"},
		{[]string{"--exec", "true", "--queue", "a", "--weights", "a"}, "NAME=WEIGHT"},
		{[]string{"--exec", "true", "--queue", "a,b", "--weights", "a=2,b=0"}, "weight 0"},
	} {
		code, _, errOut := runWorkerCmd(context.Background(), env, tc.args...)
		if code != exitUsage || !strings.Contains(errOut.String(), tc.want) || strings.Count(errOut.String(), "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 with %q on one line", tc.args, code, errOut, tc.want)
		}
	}
	code, _, errOut := runWorkerCmd(context.Background(), env, "--exec", "true", "--queue", "q")
	if code != exitFailure || strings.Contains(errOut.String(), "secret") {
		t.Errorf("unreachable servers: exit %d, stderr %q", code, errOut)
	}
}

// The command runs the shell command per task with the payload on stdin and the
// task in the environment: exit 0 completes the task, --dead-exit-code kills it,
// another status retries it with the end of the output as its last error. It
// serves /metrics and stops cleanly on cancellation.
func TestWorkerCommandRunsTasks(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	pool := testenv.Pool(t, url)
	rdb, prefix := testenv.Redis(t)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	fifo := filepath.Join(dir, "ran")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// Read-write, so the reader never sees the end of the stream between writers.
	f, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ran := bufio.NewReader(f)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, id := range []string{"ok", "bad", "flaky"} {
		res, err := ob.Enqueue(ctx, pool, outbox.Task{Queue: "jobs", ID: id, Payload: []byte("payload of " + id)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dq.Enqueue(ctx, "jobs", dispatch.Task{ID: id, Payload: []byte("payload of " + id), RunAt: res.RunAt}); err != nil {
			t.Fatal(err)
		}
	}
	script := `cat > '` + dir + `'/"$DELAYQ_TASK_ID"
echo "$DELAYQ_TASK_ID $DELAYQ_ATTEMPT $DELAYQ_IDEMPOTENCY_KEY" > '` + fifo + `'
case "$DELAYQ_TASK_ID" in
ok) exit 0 ;;
bad) echo "went wrong" >&2; exit 3 ;;
*) echo "try later" >&2; exit 1 ;;
esac`
	env := map[string]string{"DATABASE_URL": url, "REDIS_URL": testenv.RedisURL(t)}
	type result struct {
		code           int
		stdout, stderr *workerOut
	}
	done := make(chan result, 1)
	stdout, stderr := &workerOut{}, &workerOut{}
	go func() {
		m := NewMain(stdout, stderr, func(k string) string { return env[k] })
		code := m.Run(ctx, []string{"worker", "--prefix", prefix, "--queue", "jobs", "--exec", script,
			"--dead-exit-code", "3", "--backoff-base", "1h", "--listen", "127.0.0.1:0"})
		done <- result{code, stdout, stderr}
	}()

	seen := map[string]string{}
	for range 3 {
		line, err := ran.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		fields := strings.Fields(line)
		seen[fields[0]] = strings.Join(fields[1:], " ")
	}
	for id, want := range map[string]string{"ok": "1 jobs/ok", "bad": "1 jobs/bad", "flaky": "1 jobs/flaky"} {
		if seen[id] != want {
			t.Errorf("%s: command saw %q, want attempt and key %q", id, seen[id], want)
		}
	}
	admin := regexp.MustCompile(`admin=(http://\S+)`).FindStringSubmatch(stderr.String())
	if admin == nil {
		t.Fatalf("no admin address in the log:\n%s", stderr)
	}
	resp, err := http.Get(admin[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "delayq_worker_claim_lateness_seconds") {
		t.Errorf("/metrics lacks the worker's metrics")
	}

	cancel() // a graceful shutdown: the commands that ran are settled first
	var r result
	select {
	case r = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the worker command did not stop")
	}
	if r.code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", r.code, r.stderr)
	}
	if in, err := os.ReadFile(filepath.Join(dir, "ok")); err != nil || string(in) != "payload of ok" {
		t.Errorf("stdin of the command: %q %v", in, err)
	}
	check := func(id, state string, attempt int, lastErr string) {
		t.Helper()
		var st, le string
		var at int
		if err := pool.QueryRow(context.Background(), `SELECT state, attempt, COALESCE(last_error, '')
			FROM delayq_outbox WHERE queue = 'jobs' AND task_id = $1`, id).Scan(&st, &at, &le); err != nil {
			t.Fatal(err)
		}
		if st != state || at != attempt || le != lastErr {
			t.Errorf("%s: %s, attempt %d, last error %q; want %s, %d, %q", id, st, at, le, state, attempt, lastErr)
		}
	}
	check("ok", "done", 0, "")
	check("bad", "dead", 1, "exit status 3: went wrong")
	check("flaky", "pending", 1, "exit status 1: try later")
	ti, err := dq.Inspect(context.Background(), "jobs", "ok", "bad", "flaky")
	if err != nil {
		t.Fatal(err)
	}
	if ti[0].State != dispatch.StateMissing || ti[1].State != dispatch.StateDead || ti[2].State != dispatch.StateReady {
		t.Errorf("Redis states %s %s %s; want missing (acknowledged) dead ready", ti[0].State, ti[1].State, ti[2].State)
	}
}
