package examples

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

// TestTransactionalWorkerFromPython and TestTransactionalWorkerFromNode run
// examples/python/worker.py and examples/node/worker.js under `delayq worker
// --transactional` on tasks enqueued by a Go producer (outbox.Client) and one in
// the worker's language (delayq_enqueue in a transaction: psycopg, pg). Three
// first attempts hold their transaction open with the effect written: one
// command is killed with SIGKILL (its transaction rolls back), then the worker
// itself (its two commands live on, orphaned). A second worker takes every task
// over once the leases expire. Each reminder is sent exactly once (the effect
// table has no unique key: the guard alone keeps it so), each task is done and
// acknowledged in Redis, and of the two runs of an orphaned task, one was
// refused by delayq_complete.
func TestTransactionalWorkerFromPython(t *testing.T) {
	t.Parallel()
	py := python(t)
	transactionalWorker(t, py, filepath.Join("python", "worker.py"), exec.Command(py, "-c", `
import json, os, psycopg
with psycopg.connect(os.environ["DATABASE_URL"]) as conn, conn.transaction():
    for i in range(1, 7):
        conn.execute("SELECT * FROM delayq_enqueue('reminder', %s, %s)",
                     (f"sql-{i}", json.dumps({"order": f"sql-{i}", "total": 100 * i}).encode()))
`))
}

func TestTransactionalWorkerFromNode(t *testing.T) {
	t.Parallel()
	nd := node(t)
	producer := exec.Command(nd, "-e", `
const { Client } = require('pg');
(async () => {
  const c = new Client({ connectionString: process.env.DATABASE_URL });
  await c.connect();
  await c.query('BEGIN');
  for (let i = 1; i <= 6; i++) {
    await c.query("SELECT * FROM delayq_enqueue('reminder', $1, $2)",
      ['sql-' + i, Buffer.from(JSON.stringify({ order: 'sql-' + i, total: 100 * i }))]);
  }
  await c.query('COMMIT');
  await c.end();
})().catch((err) => { console.error(err); process.exit(1); });
`)
	producer.Dir = "node" // where its node_modules are
	transactionalWorker(t, nd, filepath.Join("node", "worker.js"), producer)
}

// transactionalWorker runs the scenario above with workerScript run by
// interpreter, and producer enqueueing sql-1..sql-6 (DATABASE_URL set here).
func transactionalWorker(t *testing.T, interpreter, workerScript string, producer *exec.Cmd) {
	bin := build(t, "../cmd/delayq")
	s := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	script, err := filepath.Abs(workerScript)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `CREATE TABLE reminders_sent (order_id text NOT NULL, total integer NOT NULL,
		attempt integer NOT NULL, sent_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}

	// Go enqueues go-1..go-6, the other producer sql-1..sql-6; go-1, go-2 and
	// sql-1 hold.
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := 1; i <= 6; i++ {
		id := fmt.Sprintf("go-%d", i)
		ids = append(ids, id)
		if _, err := ob.Enqueue(ctx, s.pool, outbox.Task{Queue: "reminder", ID: id,
			Payload: fmt.Appendf(nil, `{"order": %q, "total": %d}`, id, 100*i)}); err != nil {
			t.Fatal(err)
		}
	}
	producer.Env = append(os.Environ(), "DATABASE_URL="+s.dbURL)
	if out, err := producer.CombinedOutput(); err != nil {
		t.Fatalf("producer %s: %v\n%s", producer.Path, err, out)
	}
	for i := 1; i <= 6; i++ {
		ids = append(ids, fmt.Sprintf("sql-%d", i))
	}
	holding := map[string]bool{"go-1": true, "go-2": true, "sql-1": true}

	dir := t.TempDir()
	logPath := filepath.Join(dir, "worker.log")
	// The first run of each holding task keeps its transaction open for 8 s
	// (the first run, not the first attempt: on a loaded machine a first
	// attempt may end before its command starts, and the next must hold).
	command := `h=0
case "$DELAYQ_TASK_ID" in go-1|go-2|sql-1) mkdir '` + dir + `'/"held-$DELAYQ_TASK_ID" 2>/dev/null && h=8 ;; esac
exec '` + interpreter + `' '` + script + `' --hold "$h" >> '` + logPath + `' 2>&1`
	worker := func() *exec.Cmd {
		// A lease of 3 s: long enough for twelve interpreters starting at once
		// on a loaded machine, short enough for the takeover below.
		cmd := s.command(bin, "worker", "--queue", "reminder", "--transactional", "--exec", command,
			"--concurrency", "12", "--lease", "3s", "--backoff-base", "100ms", "--listen", "")
		cmd.Stderr = &strings.Builder{}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	logLines := func() []string {
		b, _ := os.ReadFile(logPath)
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	waitLog := func(what string, ok func(lines []string) bool) []string {
		t.Helper()
		for {
			if lines := logLines(); ok(lines) {
				return lines
			}
			select {
			case <-ctx.Done():
				t.Fatalf("waiting for %s; the commands' log:\n%s", what, strings.Join(logLines(), "\n"))
			case <-time.After(50 * time.Millisecond):
			}
		}
	}

	w1 := worker()
	holdLine := regexp.MustCompile(`^holding (\S+) pid (\d+)$`)
	pids := map[string]int{}
	waitLog("the three holding runs", func(lines []string) bool {
		for _, l := range lines {
			if m := holdLine.FindStringSubmatch(l); m != nil {
				pids[m[1]], _ = strconv.Atoi(m[2])
			}
		}
		return len(pids) == len(holding)
	})
	// go-2's command dies mid-transaction; then the worker, mid-run. (A command
	// gone already, its lease lost under load, has rolled back as well.)
	if err := syscall.Kill(pids["go-2"], syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		t.Fatal(err)
	}
	_ = w1.Process.Signal(syscall.SIGKILL)
	_ = w1.Wait()

	w2 := worker()
	waitCount(t, s.pool, "SELECT count(*) FROM delayq_outbox WHERE state = 'done'", len(ids), time.Minute)
	// Both runs of go-1 and sql-1 end: the orphan's (after its hold) and w2's.
	lines := waitLog("both runs of each orphaned task", func(lines []string) bool {
		for id := range holding {
			n := 0
			for _, l := range lines {
				if strings.HasPrefix(l, "sent "+id+" ") || strings.HasPrefix(l, "refused "+id+" ") {
					n++
				}
			}
			if id != "go-2" && n < 2 {
				return false
			}
		}
		return true
	})
	t.Logf("the commands' log:\n%s", strings.Join(lines, "\n"))
	_ = w2.Process.Signal(syscall.SIGTERM)
	if err := w2.Wait(); err != nil {
		t.Errorf("second worker: %v\n%s", err, w2.Stderr)
	}

	rows, err := s.pool.Query(ctx, `SELECT order_id, count(*)::int FROM reminders_sent GROUP BY order_id`)
	if err != nil {
		t.Fatal(err)
	}
	sent := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		sent[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if sent[id] != 1 {
			t.Errorf("%s: sent %d times, want once", id, sent[id])
		}
	}
	if len(sent) != len(ids) {
		t.Errorf("reminders for %d orders, want %d: %v", len(sent), len(ids), sent)
	}
	for _, id := range []string{"go-1", "sql-1"} {
		refused := 0
		for _, l := range lines {
			if strings.HasPrefix(l, "refused "+id+" ") && strings.Contains(l, "QD021") {
				refused++
			}
		}
		if refused != 1 {
			t.Errorf("%s: %d runs refused with QD021, want 1 of its 2; the log:\n%s", id, refused, strings.Join(lines, "\n"))
		}
	}

	dq, err := dispatch.New(testenv.RedisClient(t, s.redisURL), dispatch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// The orphans' runs ended after w2 acknowledged their tasks: Redis is empty.
	ti, err := dq.Inspect(ctx, "reminder", ids...)
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range ti {
		if x.State != dispatch.StateMissing {
			t.Errorf("%s: %s in Redis, want acknowledged (missing)", ids[i], x.State)
		}
	}
}
