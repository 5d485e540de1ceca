package securitytest

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/tempserver"
	"github.com/delayq/delayq/migrations"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// tlsEnv is a TLS-only PostgreSQL with a password and a TLS-only Redis with the
// relay and worker ACL users of prefix "dq" (the commands' default), and an admin
// password for the default user.
type tlsEnv struct {
	pg    *tempserver.Postgres
	redis *tempserver.TLSRedis
	dbURL string // database "app", sslmode=verify-full with the CA, password
	// URLs of Redis for the default (admin) user, the relay, the worker and the
	// operator (reconcile, check, stats, dead, cancel).
	adminURL, relayURL, workerURL, operatorURL string
	secrets                                    []string
}

const (
	tlsPGPassword       = "pg-pw-7q8r9s"
	tlsAdminPassword    = "redis-admin-pw-1t2u"
	tlsRelayPassword    = "redis-relay-pw-3v4w"
	tlsWorkerPassword   = "redis-worker-pw-5x6y"
	tlsOperatorPassword = "redis-operator-pw-7z8a"
)

func startTLSEnv(t *testing.T) tlsEnv {
	t.Helper()
	ctx := ctxT(t, 2*time.Minute)
	pg, _, err := tempserver.StartTLSPostgres(ctx, tempserver.TLSPostgresOptions{Password: tlsPGPassword})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	dbURL, err := tempserver.CreateDatabase(ctx, pg.URL(), "app", "")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--requirepass", tlsAdminPassword}
	args = append(args, aclServerArgs("delayq-relay", tlsRelayPassword, "dq", relayCommands)...)
	args = append(args, aclServerArgs("delayq-worker", tlsWorkerPassword, "dq", workerCommands)...)
	args = append(args, aclServerArgs("delayq-operator", tlsOperatorPassword, "dq", operatorCommands)...)
	rs, err := tempserver.StartTLSRedis(ctx, tempserver.RedisOptions{Args: args})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Close)
	withUser := func(user, pw string) string {
		u, _ := url.Parse(rs.URL())
		u.User = url.UserPassword(user, pw)
		return u.String()
	}
	return tlsEnv{pg: pg, redis: rs, dbURL: dbURL,
		adminURL:    withUser("default", tlsAdminPassword),
		relayURL:    withUser("delayq-relay", tlsRelayPassword),
		workerURL:   withUser("delayq-worker", tlsWorkerPassword),
		operatorURL: withUser("delayq-operator", tlsOperatorPassword),
		secrets:     []string{tlsPGPassword, tlsAdminPassword, tlsRelayPassword, tlsWorkerPassword, tlsOperatorPassword},
	}
}

// client opens a Redis client on one of the env's URLs, trusting the test CA.
func (e tlsEnv) client(t *testing.T, rawURL string) *redis.Client {
	t.Helper()
	opt, err := e.redis.Options(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (e tlsEnv) pool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func readyz(t *testing.T, addr string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestCommandsOverTLSWithACL runs the commands an operator runs, as processes,
// configured by URLs only: PostgreSQL over TLS with sslmode=verify-full and the
// CA as sslrootcert, Redis over rediss:// (the CA given to Go through
// SSL_CERT_FILE) as the relay's, the worker's and the operator's ACL users. Tasks
// enqueued on the command line are relayed and run, one dies, is listed, retried
// and purged, one is cancelled out of Redis, stats, check and reconcile run;
// /readyz of relay and worker is 200 (PING over TLS as the restricted users).
// Redis refused nothing and no password is printed.
func TestCommandsOverTLSWithACL(t *testing.T) {
	t.Parallel()
	e := startTLSEnv(t)
	if err := tempserver.CheckTLS(ctxT(t, time.Minute), e.dbURL); err != nil {
		t.Fatal(err)
	}
	env := func(redisURL string) map[string]string {
		return map[string]string{"DATABASE_URL": e.dbURL, "REDIS_URL": redisURL, "SSL_CERT_FILE": e.redis.TLS().CAFile}
	}
	var outputs []string
	run := func(redisURL string, code int, args ...string) cmdResult {
		t.Helper()
		r := runBin(t, env(redisURL), "", args...)
		outputs = append(outputs, r.out())
		if r.code != code {
			t.Fatalf("%v: exit %d, want %d\n%s", args, r.code, code, r.out())
		}
		return r
	}
	run("", 0, "migrate", "up")

	rl := startBin(t, env(e.relayURL), "relay", "--listen", "127.0.0.1:0", "--poll-interval", "100ms", "--log-level", "debug")
	relayAdmin := rl.waitLog(t, time.Minute, `admin=http://(127\.0\.0\.1:\d+)`)
	outDir := t.TempDir()
	wenv := env(e.workerURL)
	wenv["OUT"] = outDir
	wk := startBin(t, wenv, "worker", "--queue", "mail", "--exec", `cat > "$OUT/$DELAYQ_TASK_ID"; test "$DELAYQ_TASK_ID" != bad`,
		"--listen", "127.0.0.1:0", "--log-level", "debug")
	workerAdmin := wk.waitLog(t, time.Minute, `admin=http://(127\.0\.0\.1:\d+)`)
	for _, a := range []string{relayAdmin, workerAdmin} {
		if code := readyz(t, a); code != http.StatusOK {
			t.Errorf("/readyz of %s: %d, want 200", a, code)
		}
	}

	pool := e.pool(t)
	state := func(id string) func() bool {
		return func() bool {
			var st string
			_ = pool.QueryRow(context.Background(), `SELECT state FROM delayq_outbox WHERE task_id = $1`, id).Scan(&st)
			return st == map[string]string{"m-1": "done", "bad": "dead", "later": "queued"}[id]
		}
	}
	run("", 0, "enqueue", "--queue", "mail", "--id", "m-1", "--payload", "hello over TLS")
	run("", 0, "enqueue", "--queue", "mail", "--id", "bad", "--max-attempts", "1", "--payload", "x")
	run("", 0, "enqueue", "--queue", "mail", "--id", "later", "--delay", "30m")
	waitFor(t, 30*time.Second, "m-1 done", state("m-1"))
	waitFor(t, 30*time.Second, "bad dead", state("bad"))
	waitFor(t, 30*time.Second, "later queued", state("later"))
	if got, err := os.ReadFile(filepath.Join(outDir, "m-1")); err != nil || string(got) != "hello over TLS" {
		t.Errorf("the command read %q from standard input (%v)", got, err)
	}

	// The operator's commands, as delayq-operator.
	op := e.operatorURL
	run(op, 0, "stats")
	run(op, 0, "check")
	run(op, 0, "reconcile", "--dry-run")
	run(op, 0, "reconcile")
	if r := run(op, 0, "dead", "list"); !strings.Contains(r.stdout, "bad") {
		t.Errorf("dead list does not show bad:\n%s", r.stdout)
	}
	if err := os.Remove(filepath.Join(outDir, "bad")); err != nil {
		t.Fatal(err)
	}
	run(op, 0, "dead", "retry", "--queue", "mail", "bad")
	waitFor(t, 30*time.Second, "bad run again", func() bool {
		_, err := os.Stat(filepath.Join(outDir, "bad"))
		return err == nil
	})
	deadline := time.Now().Add(60 * time.Second)
	for !state("bad")() {
		if time.Now().After(deadline) {
			var st, lastErr string
			var attempt, maxAttempts int
			_ = pool.QueryRow(context.Background(), `SELECT state, attempt, max_attempts, COALESCE(last_error, '') FROM delayq_outbox WHERE task_id = 'bad'`).Scan(&st, &attempt, &maxAttempts, &lastErr)
			r := runBin(t, env(e.adminURL), "", "stats")
			t.Fatalf("bad not dead again after 60s: %s, attempt %d of %d, last error %q\n%s\nworker:\n%s", st, attempt, maxAttempts, lastErr, r.out(), wk.out())
		}
		time.Sleep(20 * time.Millisecond)
	}
	run(op, 0, "dead", "purge", "--yes", "--queue", "mail")
	if r := run(op, 0, "cancel", "--queue", "mail", "--id", "later"); !strings.Contains(r.stdout, "removed it from Redis") {
		t.Errorf("cancel did not remove the task from Redis:\n%s", r.stdout)
	}
	run(op, 0, "check")

	if code := wk.stop(t); code != 0 {
		t.Errorf("worker exit %d:\n%s", code, wk.out())
	}
	if code := rl.stop(t); code != 0 {
		t.Errorf("relay exit %d:\n%s", code, rl.out())
	}
	outputs = append(outputs, rl.out(), wk.out())
	if entries := aclLog(t, e.client(t, e.adminURL)); len(entries) != 0 {
		t.Errorf("Redis refused commands:\n%s", strings.Join(entries, "\n"))
	}
	for _, out := range outputs {
		noSecret(t, "command output", out, e.secrets...)
	}
}

// TestLibraryOverTLSWithACL is the same path in Go: a pgxpool on the verify-full
// URL, go-redis clients on rediss:// URLs with the CA in tls.Config.RootCAs, the
// relay and a worker as their ACL users.
func TestLibraryOverTLSWithACL(t *testing.T) {
	t.Parallel()
	e := startTLSEnv(t)
	ctx := ctxT(t, 2*time.Minute)
	db, err := migrations.OpenDB(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Up(ctx, db, migrations.Config{}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	pool := e.pool(t)
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	relayDQ, err := dispatch.New(e.client(t, e.relayURL), dispatch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	workerDQ, err := dispatch.New(e.client(t, e.workerURL), dispatch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := relay.New(e.pool(t), relayDQ.AsRedis(), relay.Config{PollInterval: 100 * time.Millisecond, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := clientkit.NewClient(e.pool(t), workerDQ, ob, delayq.WorkerConfig{Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		got = map[string]string{}
	)
	if err := w.Handle("mail", func(ctx context.Context, task *delayq.Task) error {
		mu.Lock()
		defer mu.Unlock()
		got[task.ID] = string(task.Payload)
		return nil
	}, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	errs := make(chan error, 2)
	go func() { errs <- rl.Run(runCtx) }()
	go func() { errs <- w.Run(runCtx) }()
	defer func() {
		stop()
		for range 2 {
			if err := <-errs; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("Run: %v", err)
			}
		}
	}()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := ob.Enqueue(ctx, tx, outbox.Task{Queue: "mail", ID: id, Payload: []byte("to " + id)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "three tasks run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 3
	})
	mu.Lock()
	if got["a"] != "to a" || got["c"] != "to c" {
		t.Errorf("payloads: %v", got)
	}
	mu.Unlock()
	if entries := aclLog(t, e.client(t, e.adminURL)); len(entries) != 0 {
		t.Errorf("Redis refused commands:\n%s", strings.Join(entries, "\n"))
	}
}
