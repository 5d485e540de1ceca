// Package examples holds the tests that build and exercise the example programs,
// each as separate processes against real servers.
package examples

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/relay"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// build compiles the example in dir into a temporary binary. The quick loop (-short)
// skips the tests that build one: a build links a whole program (seconds of CPU);
// make test runs them.
func build(t *testing.T, dir string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the example as a process: make test runs it")
	}
	bin := filepath.Join(t.TempDir(), filepath.Base(dir))
	out, err := exec.Command("go", "build", "-o", bin, "./"+dir).CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s", dir, err, out)
	}
	return bin
}

type servers struct {
	dbURL, redisURL string
	pool            *pgxpool.Pool
}

// setup gives the test a database and a Redis of its own (the examples use the
// default key prefix) and runs a relay on them in the background.
func setup(t *testing.T) servers {
	t.Helper()
	s := servers{dbURL: testenv.PostgresURL(t), redisURL: testenv.OwnRedis(t).URL()}
	s.pool = testenv.Pool(t, s.dbURL)
	rdb := testenv.RedisClient(t, s.redisURL)
	dq, err := dispatch.New(rdb, dispatch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := relay.New(s.pool, dq.AsRedis(), relay.Config{ReapInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	return s
}

func (s servers) command(bin string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+s.dbURL, "REDIS_URL="+s.redisURL)
	return cmd
}

// waitCount polls query until it returns want (or fails the test after timeout).
func waitCount(t *testing.T, pool *pgxpool.Pool, query string, want int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var n int
	for {
		if err := pool.QueryRow(context.Background(), query).Scan(&n); err == nil && n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %d after %v, want %d", query, n, timeout, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPayment runs the payment example as separate processes: enqueue, a worker
// that is SIGKILLed and started again, then the report. Every order is charged
// exactly once.
func TestPayment(t *testing.T) {
	t.Parallel()
	bin := build(t, "payment")
	s := setup(t)

	out, err := s.command(bin, "enqueue", "--count", "60", "--delay", "300ms").CombinedOutput()
	if err != nil {
		t.Fatalf("enqueue: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "enqueued 60 charges, refused 60 duplicates") {
		t.Fatalf("enqueue output: %s", out)
	}

	w1 := s.command(bin, "worker", "--concurrency", "8")
	if err := w1.Start(); err != nil {
		t.Fatal(err)
	}
	waitCount(t, s.pool, "SELECT count(*) FROM payment_ledger", 60, 30*time.Second)
	_ = w1.Process.Signal(syscall.SIGKILL)
	_ = w1.Wait()

	// More orders while no worker runs; a fresh worker process charges them.
	out, err = s.command(bin, "enqueue", "--start", "61", "--count", "40", "--delay", "100ms").CombinedOutput()
	if err != nil {
		t.Fatalf("enqueue: %v\n%s", err, out)
	}
	w2 := s.command(bin, "worker")
	if err := w2.Start(); err != nil {
		t.Fatal(err)
	}
	waitCount(t, s.pool, "SELECT count(*) FROM payment_ledger", 100, 30*time.Second)
	_ = w2.Process.Signal(syscall.SIGTERM)
	if err := w2.Wait(); err != nil {
		t.Errorf("worker after SIGTERM: %v (want a clean exit)", err)
	}

	out, err = s.command(bin, "report").CombinedOutput()
	if err != nil {
		t.Fatalf("report: %v\n%s", err, out)
	}
	if want := "orders 100, charges 100, orders charged twice 0"; !strings.Contains(string(out), want) {
		t.Fatalf("report = %q, want %q", out, want)
	}
}

// TestHTTPAPI runs the HTTP example: signups schedule welcome emails in the
// request's transaction; a refused signup schedules nothing.
func TestHTTPAPI(t *testing.T) {
	t.Parallel()
	bin := build(t, "httpapi")
	s := setup(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	var stderr bytes.Buffer
	cmd := s.command(bin, "--listen", addr, "--delay", "200ms")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	base := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("httpapi did not come up: %v\n%s", err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	post := func(email string) int {
		resp, err := http.Post(base+"/signup?email="+email, "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 5 {
		if code := post(fmt.Sprintf("user%d@example.com", i)); code != http.StatusCreated {
			t.Fatalf("signup %d: status %d", i, code)
		}
	}
	if code := post("user0@example.com"); code != http.StatusConflict {
		t.Fatalf("repeated signup: status %d, want 409", code)
	}
	if code := post("has%20space@example.com"); code != http.StatusBadRequest {
		t.Fatalf("signup with an invalid id: status %d, want 400", code)
	}
	waitCount(t, s.pool, "SELECT count(*) FROM sent_emails", 5, 30*time.Second)
	waitCount(t, s.pool, "SELECT count(DISTINCT idempotency_key) FROM sent_emails", 5, time.Second)
	waitCount(t, s.pool, "SELECT count(*) FROM users", 5, time.Second)
}
