package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

// startUI runs delayq ui in-process on a free port until the test ends and
// returns its URL.
func startUI(t *testing.T, env map[string]string, args ...string) string {
	t.Helper()
	return serve(t, env, append([]string{"ui", "--listen", "127.0.0.1:0"}, args...)...)
}

// serve runs a delayq command that serves the dashboard, in-process until the test
// ends, and returns the URL it prints.
func serve(t *testing.T, env map[string]string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- NewMain(pw, io.Discard, func(k string) string { return env[k] }).Run(ctx, args)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("delayq %s exited %d", args[0], code)
		}
	})
	sc := bufio.NewScanner(pr)
	re := regexp.MustCompile(`serving (http://\S+/)`)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			go func() { _, _ = io.Copy(io.Discard, pr) }()
			return strings.TrimSuffix(m[1], "/")
		}
	}
	t.Fatalf("delayq %s did not start", args[0])
	return ""
}

// The counts the dashboard shows are those of delayq stats --json, on the same data.
func TestUICountsEqualStats(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var tasks []outbox.Task
	for i := range 30 {
		tasks = append(tasks, outbox.Task{Queue: fmt.Sprintf("q%d", i%3), ID: fmt.Sprintf("t%d", i), Payload: []byte(`{}`), Delay: time.Duration(i) * time.Minute})
	}
	if _, err := ob.EnqueueMany(ctx, b.pool, tasks); err != nil {
		t.Fatal(err)
	}
	store := taskstate.New(taskstate.Config{Schema: "public"})
	for _, k := range [][2]string{{"q1", "t1"}, {"q1", "t4"}, {"q2", "t2"}} {
		if ok, err := store.RecordFailure(ctx, b.pool, taskstate.Failure{Key: taskstate.Key{Queue: k[0], ID: k[1], Version: 1}, Attempt: 1, Err: "x", Dead: true}); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	if err := ob.Cancel(ctx, b.pool, "q0", "t3"); err != nil {
		t.Fatal(err)
	}
	// Redis counts too: tasks due now, later and overdue, straight into Redis.
	if _, err := b.dq.Enqueue(ctx, "q1", dispatch.Task{ID: "r1"}, dispatch.Task{ID: "r2", RunAt: time.Now().Add(time.Hour)},
		dispatch.Task{ID: "r3", RunAt: time.Now().Add(-2 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	r := b.run(t, "stats", "--json", "--prefix", b.prefix)
	r.want(t, exitOK)
	var want []reconcile.QueueStats
	if err := json.Unmarshal([]byte(r.stdout), &want); err != nil || len(want) != 3 {
		t.Fatalf("stats --json: %v\n%s", err, r.stdout)
	}
	base := startUI(t, b.env, "--read-only", "--prefix", b.prefix)
	resp, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	page := string(body)
	cell := regexp.MustCompile(`data-count="([a-z_]+)"(?: href="[^"]*")?>(\d+)<`)
	for _, s := range want {
		start := strings.Index(page, `<tr data-queue="`+s.Queue+`">`)
		if start < 0 {
			t.Fatalf("no row for %s", s.Queue)
		}
		end := strings.Index(page[start:], "</tr>")
		got := map[string]int64{}
		for _, m := range cell.FindAllStringSubmatch(page[start:start+end], -1) {
			n, _ := strconv.ParseInt(m[2], 10, 64)
			got[m[1]] = n
		}
		exp := map[string]int64{"redis_ready": s.Ready, "redis_due_now": s.DueNow, "redis_active": s.Active,
			"redis_expired_leases": s.ExpiredLeases, "redis_dead": s.Dead, "redis_overdue": s.Overdue}
		for st, n := range s.Postgres {
			exp[string(st)] = n
		}
		if fmt.Sprint(got) != fmt.Sprint(exp) {
			t.Errorf("%s: UI %v, stats --json %v", s.Queue, got, exp)
		}
	}
}

// delayq demo --ui runs a live workload and serves it: a newcomer sees its queues
// fill, tasks done and charted, and dead letters appear.
func TestDemoUI(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	demoBase := serve(t, b.env, "demo", "--ui", "--listen", "127.0.0.1:0", "--read-only")
	done := regexp.MustCompile(`<tr data-queue="charge">[\s\S]*?data-done-hour="(\d+)"`)
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get(demoBase + "/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		page := string(body)
		if m := done.FindStringSubmatch(page); m != nil && m[1] != "0" && strings.Contains(page, `<tr data-queue="email">`) &&
			strings.Contains(page, `<meta http-equiv="refresh" content="2">`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the demo's dashboard never showed charge tasks done:\n%s", page)
		}
		time.Sleep(200 * time.Millisecond) // the demo's workload runs on its own clock
	}
}

// delayq ui --database KEY=URL (repeated) serves one dashboard over the
// databases: the overview with each one's queues and the total, each database's
// own pages under /db/KEY/, actions behind the token; bad values are usage
// errors in one line.
func TestUISeveralDatabases(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	usURL := testenv.PostgresURL(t)
	us := testenv.Pool(t, usURL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	task := func(queue, id string) outbox.Task {
		return outbox.Task{Queue: queue, ID: id, Payload: []byte(`{}`), Delay: time.Hour}
	}
	if _, err := ob.EnqueueMany(ctx, b.pool, []outbox.Task{task("pay", "p1"), task("pay", "p2"), task("pay", "p3")}); err != nil {
		t.Fatal(err)
	}
	if _, err := ob.EnqueueMany(ctx, us, []outbox.Task{task("pay", "p1"), task("mail", "m1")}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"REDIS_URL": b.env["REDIS_URL"], uiTokenEnv: "cli-token-0123456789abcdef"}
	base := startUI(t, env, "--prefix", b.prefix, "--database", "eu1="+b.env["DATABASE_URL"], "--database", "us1="+usURL)
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %s\n%s", path, resp.Status, body)
		}
		if !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") {
			t.Errorf("GET %s: no CSP", path)
		}
		return resp, string(body)
	}
	_, page := get("/")
	pending := regexp.MustCompile(`data-count="pending">(\d+)<`)
	for marker, want := range map[string]string{`<tr data-db="eu1" data-queue="pay">`: "3", `<tr data-db="us1" data-queue="pay">`: "1",
		`<tr data-db="us1" data-queue="mail">`: "1", `data-total data-queue="pay">`: "4", `data-total-all>`: "5"} {
		start := strings.Index(page, marker)
		if start < 0 {
			t.Errorf("the overview has no row %s\n%s", marker, page)
			continue
		}
		if m := pending.FindStringSubmatch(page[start:]); m == nil || m[1] != want {
			t.Errorf("row %s: pending %v, want %s", marker, m, want)
		}
	}
	if strings.Contains(page, `data-db="eu1" data-queue="mail"`) {
		t.Error("eu1 has a mail row")
	}
	if _, body := get("/db/us1/"); !strings.Contains(body, `<tr data-queue="mail">`) || strings.Contains(body, `data-count="pending" href="/db/us1/tasks?queue=pay&amp;state=pending">3<`) {
		t.Errorf("us1's queues page:\n%s", body)
	}
	if _, body := get("/db/eu1/task?queue=pay&id=p3"); !strings.Contains(body, `id="pg-state" class="state pending"`) {
		t.Errorf("eu1's task p3:\n%s", body)
	}
	resp, err := http.Post(base+"/db/eu1/action/pause", "application/x-www-form-urlencoded", strings.NewReader("queue=pay"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("pause without the token: %s", resp.Status)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--database", "EU=postgres://u:s3cret@h/db"}, "bad --database: value 1: key"},
		{[]string{"--database", "eu1=postgres://h/db", "--database", "eu1=postgres://h2/db"}, `key "eu1" given twice`},
		{[]string{"--database", "eu1=" + usURL, "--database-url", usURL}, "drop --database-url"},
		{[]string{"--database", "eu1=" + usURL, "--demo"}, "drop --database"},
	} {
		r := cliRun(t, env, append([]string{"ui", "--listen", "127.0.0.1:0"}, c.args...)...)
		r.want(t, exitUsage)
		r.oneLineErr(t, c.want)
		if strings.Contains(r.stderr, "s3cret") {
			t.Errorf("the password in %q", r.stderr)
		}
	}
}
