package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

// --transactional: the command (psql here) writes its effect and calls
// delayq_complete in one transaction, and the worker acknowledges the task in
// Redis; a command that exits 0 without completing is retried; a completion of
// another version is refused with its effect; a command that wrote a delay to
// DELAYQ_RETRY_AFTER_FILE is retried after it rather than the backoff, and one
// that wrote nonsense after the backoff, the error saying so.
func TestWorkerCommandTransactional(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("psql"); err != nil {
		t.Skip("no psql")
	}
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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	fifo := filepath.Join(dir, "ran")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ran := bufio.NewReader(f)

	ids := []string{"ok", "noop", "stale", "later", "nonsense"}
	for _, id := range ids {
		res, err := ob.Enqueue(ctx, pool, outbox.Task{Queue: "jobs", ID: id})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dq.Enqueue(ctx, "jobs", dispatch.Task{ID: id, Version: 1, RunAt: res.RunAt}); err != nil {
			t.Fatal(err)
		}
	}
	script := `sql() { psql "$DELAYQ_DATABASE_URL" -X -q -1 -v ON_ERROR_STOP=1 -c "INSERT INTO effects VALUES ('$DELAYQ_TASK_ID')" \
  -c "SELECT \"$DELAYQ_SCHEMA\".delayq_complete('$DELAYQ_QUEUE', '$DELAYQ_TASK_ID', $1)" >/dev/null; }
case "$DELAYQ_TASK_ID" in
ok) sql "$DELAYQ_VERSION" ;;
noop) true ;;
stale) sql $((DELAYQ_VERSION + 1)) ;;
later) echo 90 > "$DELAYQ_RETRY_AFTER_FILE"; false ;;
*) echo soon > "$DELAYQ_RETRY_AFTER_FILE"; false ;;
esac
rc=$?
echo "$DELAYQ_TASK_ID $rc" > '` + fifo + `'
exit $rc`
	env := map[string]string{"DATABASE_URL": url, "REDIS_URL": testenv.RedisURL(t)}
	done := make(chan int, 1)
	stderr := &workerOut{}
	go func() {
		m := NewMain(&workerOut{}, stderr, func(k string) string { return env[k] })
		done <- m.Run(ctx, []string{"worker", "--prefix", prefix, "--queue", "jobs", "--exec", script,
			"--transactional", "--backoff-base", "1h", "--listen", ""})
	}()
	seen := map[string]string{}
	for range ids {
		line, err := ran.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		id, rc, _ := strings.Cut(strings.TrimSpace(line), " ")
		seen[id] = rc
	}
	if seen["ok"] != "0" || seen["noop"] != "0" || seen["stale"] == "0" {
		t.Errorf("exit statuses %v: want ok 0, noop 0, stale not 0 (psql's error)", seen)
	}
	cancel() // a graceful shutdown settles the runs that ended
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("exit %d; stderr:\n%s", code, stderr)
		}
	case <-time.After(time.Minute):
		t.Fatal("the worker command did not stop")
	}

	check := func(id, state string, attempt, effects int, lastError string) {
		t.Helper()
		var (
			st, le string
			at, n  int
		)
		if err := pool.QueryRow(context.Background(), `SELECT state, attempt, COALESCE(last_error, ''),
			(SELECT count(*) FROM effects WHERE effects.id = $1) FROM delayq_outbox WHERE queue = 'jobs' AND task_id = $1`, id).Scan(&st, &at, &le, &n); err != nil {
			t.Fatal(err)
		}
		if st != state || at != attempt || n != effects || !strings.Contains(le, lastError) {
			t.Errorf("%s: %s, attempt %d, %d effects, last error %q; want %s, %d, %d, %q", id, st, at, n, le, state, attempt, effects, lastError)
		}
	}
	check("ok", "done", 0, 1, "")
	// The command's own completion is the run's success, not a duplicate the
	// worker's guard suppressed.
	if strings.Contains(stderr.String(), "run suppressed") {
		t.Errorf("the command's completion was counted suppressed:\n%s", stderr)
	}
	check("noop", "pending", 1, 0, "command exited 0 without completing the task: call delayq_complete('jobs', 'noop', 1)")
	check("stale", "pending", 1, 0, "stale run: the task holds version 1, this run version 2")
	check("later", "pending", 1, 0, "exit status 1")
	check("nonsense", "pending", 1, 0, `exit status 1 (DELAYQ_RETRY_AFTER_FILE: "soon" is not a delay of 1ms..24h: the backoff applies)`)

	// The retry of "later" is due 90 s after its failure, "nonsense"'s after the
	// 1h backoff (jittered into [30m, 1h]).
	var later, nonsense time.Duration
	if err := pool.QueryRow(context.Background(), `SELECT
		round(extract(epoch FROM (SELECT run_at FROM delayq_outbox WHERE task_id = 'later') - now()) * 1e9)::bigint,
		round(extract(epoch FROM (SELECT run_at FROM delayq_outbox WHERE task_id = 'nonsense') - now()) * 1e9)::bigint`).Scan(&later, &nonsense); err != nil {
		t.Fatal(err)
	}
	if later < 30*time.Second || later > 90*time.Second {
		t.Errorf("later: due in %v, want 90s after its failure", later)
	}
	if nonsense < 29*time.Minute {
		t.Errorf("nonsense: due in %v, want the backoff of 1h jittered", nonsense)
	}
	ti, err := dq.Inspect(context.Background(), "jobs", "ok", "noop")
	if err != nil {
		t.Fatal(err)
	}
	if ti[0].State != dispatch.StateMissing || ti[1].State != dispatch.StateReady {
		t.Errorf("Redis states %s %s; want missing (acknowledged), ready (to retry)", ti[0].State, ti[1].State)
	}
}

// readRetryAfter reads seconds or a duration; an absent file is no delay; the
// rest is refused with the reason.
func TestReadRetryAfter(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, c := range []struct {
		in   string
		want time.Duration
		bad  bool
	}{
		{"30\n", 30 * time.Second, false},
		{" 0.5 ", 500 * time.Millisecond, false},
		{"1m30s", 90 * time.Second, false},
		{"0", 0, true},
		{"-5", 0, true},
		{"25h", 0, true},
		{"soon", 0, true},
		{"", 0, true},
	} {
		p := filepath.Join(dir, "f")
		if err := os.WriteFile(p, []byte(c.in), 0o600); err != nil {
			t.Fatal(err)
		}
		d, bad := readRetryAfter(p)
		if d != c.want || (bad != "") != c.bad {
			t.Errorf("%q: %v %q; want %v, refused %v", c.in, d, bad, c.want, c.bad)
		}
	}
	if d, bad := readRetryAfter(filepath.Join(dir, "absent")); d != 0 || bad != "" {
		t.Errorf("absent file: %v %q", d, bad)
	}
}
