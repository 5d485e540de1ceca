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
