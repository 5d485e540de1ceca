package examples

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
)

// python returns the interpreter the Python example runs on: Debian's
// /usr/bin/python3, which python3-psycopg serves, else python3 on PATH; the test
// is skipped only when there is none. make test installs psycopg (make
// examples-deps): an interpreter without it fails the test.
func python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(p); err == nil {
			if out, err := exec.Command(path, "-c", "import psycopg").CombinedOutput(); err != nil {
				t.Fatalf("%s cannot import psycopg (make examples-deps installs Debian's python3-psycopg): %v\n%s", path, err, out)
			}
			return path
		}
	}
	t.Skip("no python3")
	return ""
}

// node returns the node binary (skipped only when there is none) and checks that
// examples/node's dependencies are installed (make examples-deps runs npm ci).
func node(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node")
	}
	if _, err := os.Stat(filepath.Join("node", "node_modules", "pg", "package.json")); err != nil {
		t.Fatalf("examples/node has no node_modules/pg (make examples-deps runs npm ci there): %v", err)
	}
	return path
}

// TestEnqueueFromPython and TestEnqueueFromNode run the examples that enqueue
// through the SQL API inside a business transaction: a commit writes the order and
// its task, a second enqueue of the order is reported as a duplicate, a rollback
// writes neither, and an invalid queue name is refused with its SQLSTATE.
func TestEnqueueFromPython(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the example as a process: make test runs it")
	}
	anyLanguage(t, python(t), filepath.Join("python", "enqueue.py"))
}

func TestEnqueueFromNode(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the example as a process: make test runs it")
	}
	anyLanguage(t, node(t), filepath.Join("node", "enqueue.js"))
}

func anyLanguage(t *testing.T, interpreter, script string) {
	dbURL := testenv.PostgresURL(t)
	pool := testenv.Pool(t, dbURL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, interpreter, append([]string{script}, args...)...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", script, strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"place", "order-1"}, "enqueued order-1 due "},
		{[]string{"place", "order-1"}, "duplicate order-1"},
		{[]string{"rollback", "order-2"}, "rolled back order-2"},
		{[]string{"invalid"}, "refused QD001: invalid queue name: "},
	} {
		if got := run(c.args...); !strings.HasPrefix(got, c.want) {
			t.Errorf("%s %s: %q, want %q…", script, strings.Join(c.args, " "), got, c.want)
		}
	}
	var (
		payload     []byte
		maxAttempts int
		delay       time.Duration
		tasks       int
		orders      []string
	)
	if err := pool.QueryRow(ctx, `SELECT payload, max_attempts, round(extract(epoch FROM run_at - created_at) * 1e9)::bigint
		FROM delayq_outbox WHERE queue = 'reminder' AND task_id = 'order-1'`).Scan(&payload, &maxAttempts, &delay); err != nil {
		t.Fatal(err)
	}
	var p struct {
		Order string `json:"order"`
		Total int    `json:"total"`
	}
	if err := json.Unmarshal(payload, &p); err != nil || p.Order != "order-1" || p.Total != 1250 {
		t.Errorf("payload %q (%v)", payload, err)
	}
	// run_at is the enqueue's statement time plus an hour, created_at its
	// transaction's start, a moment before the statement.
	if maxAttempts != 5 || delay < time.Hour || delay > time.Hour+time.Minute {
		t.Errorf("max attempts %d, run_at − created_at %v; want 5, just over 1h", maxAttempts, delay)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*), (SELECT array_agg(id ORDER BY id) FROM orders) FROM delayq_outbox`).Scan(&tasks, &orders); err != nil {
		t.Fatal(err)
	}
	if tasks != 1 || len(orders) != 1 || orders[0] != "order-1" {
		t.Errorf("%d tasks, orders %v: want the one committed order and its task", tasks, orders)
	}
}

// TestREADMEFromAnyLanguage runs the psql one-liners of the README's "From any
// language" section, in order, on a migrated database: each succeeds, but the one
// marked "# fails:", which fails with the text after it; then checks what they wrote.
func TestREADMEFromAnyLanguage(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("no psql")
	}
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## From any language\n")
	if !ok {
		t.Fatal("README.md has no section \"From any language\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var lines []string
	for _, l := range strings.Split(section, "\n") {
		if strings.HasPrefix(l, "psql ") {
			lines = append(lines, l)
		}
	}
	if len(lines) < 5 {
		t.Fatalf("%d psql lines in the section; the README or this test changed", len(lines))
	}
	dbURL := testenv.PostgresURL(t)
	for _, l := range lines {
		cmd := exec.Command("sh", "-c", l)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "PATH="+filepath.Dir(psql)+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if _, want, fails := strings.Cut(l, "# fails: "); fails {
			if err == nil || !strings.Contains(string(out), want) {
				t.Errorf("%s: %v, output %q; want a failure saying %q", l, err, out, want)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v\n%s", l, err, out)
		}
	}
	pool := testenv.Pool(t, dbURL)
	rows, err := pool.Query(context.Background(), `SELECT task_id || ' ' || state || ' v' || version || ' p' || priority || ' ' || convert_from(payload, 'UTF8')
		FROM delayq_outbox ORDER BY task_id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{`order-2001 pending v1 p0 {"order":2001}`, "order-2002 pending v2 p5 ", "order-2003 done v1 p0 ", "order-2004 cancelled v1 p0 "}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
