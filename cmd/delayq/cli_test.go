package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/testenv"
)

// cliResult is what one run of a command printed and returned.
type cliResult struct {
	code           int
	stdout, stderr string
}

// cliRun runs a command in-process with env as its whole environment.
func cliRun(t *testing.T, env map[string]string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	code := NewMain(&out, &errOut, func(k string) string { return env[k] }).Run(ctx, args)
	return cliResult{code: code, stdout: out.String(), stderr: errOut.String()}
}

func (r cliResult) want(t *testing.T, code int, stdoutHas ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d\nstdout: %s\nstderr: %s", r.code, code, r.stdout, r.stderr)
	}
	for _, s := range stdoutHas {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("stdout lacks %q:\n%s", s, r.stdout)
		}
	}
}

// oneLineErr checks that stderr is exactly one line containing has.
func (r cliResult) oneLineErr(t *testing.T, has string) {
	t.Helper()
	if strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") {
		t.Errorf("stderr is not one line: %q", r.stderr)
	}
	if !strings.Contains(r.stderr, has) {
		t.Errorf("stderr %q lacks %q", r.stderr, has)
	}
}

// cliBundle is a database and a Redis prefix of one test, with the environment
// that points the commands at them.
type cliBundle struct {
	env    map[string]string
	prefix string
	pool   *pgxpool.Pool
	rdb    *redis.Client
	dq     *dispatch.Client
}

func newCLIBundle(t *testing.T) cliBundle {
	t.Helper()
	url := testenv.PostgresURL(t)
	rdb, prefix := testenv.Redis(t)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return cliBundle{
		env:    map[string]string{"DATABASE_URL": url, "REDIS_URL": testenv.RedisURL(t)},
		prefix: prefix, pool: testenv.Pool(t, url), rdb: rdb, dq: dq,
	}
}

func (b cliBundle) run(t *testing.T, args ...string) cliResult {
	t.Helper()
	return cliRun(t, b.env, args...)
}

func (b cliBundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

func TestEnqueueCancelRescheduleCommands(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	b.run(t, "enqueue", "--queue", "mail", "--id", "m-1", "--delay", "1h", "--payload", "hello", "--max-attempts", "3").
		want(t, exitOK, "enqueued mail/m-1, due ")
	b.run(t, "enqueue", "--queue", "mail", "--id", "m-1").want(t, exitOK, "duplicate: mail/m-1 exists already")
	file := filepath.Join(t.TempDir(), "payload.json")
	if err := os.WriteFile(file, []byte(`{"n":2}`), 0o600); err != nil {
		t.Fatal(err)
	}
	b.run(t, "enqueue", "--queue", "mail", "--id", "m-2", "--at", "2030-01-02T03:04:05Z", "--payload-file", file).
		want(t, exitOK, "due 2030-01-02T03:04:05Z")

	var payload []byte
	var maxAtt int
	var runAt time.Time
	if err := b.pool.QueryRow(context.Background(),
		`SELECT payload, max_attempts, run_at FROM delayq_outbox WHERE queue = 'mail' AND task_id = 'm-2'`).
		Scan(&payload, &maxAtt, &runAt); err != nil {
		t.Fatal(err)
	}
	if string(payload) != `{"n":2}` || maxAtt != 25 || !runAt.Equal(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("m-2: %q, %d, %v", payload, maxAtt, runAt)
	}
	b.run(t, "enqueue", "--queue", "mail", "--id", "m-3", "--start-by", "2030-01-02T03:04:05Z").want(t, exitOK, "enqueued mail/m-3")
	b.run(t, "enqueue", "--queue", "mail", "--id", "m-4", "--start-by", "soon").want(t, exitUsage)
	b.run(t, "enqueue", "--queue", "mail", "--id", "m-5", "--priority", "9").want(t, exitOK, "enqueued mail/m-5")
	b.run(t, "enqueue", "--queue", "mail", "--id", "m-6", "--priority", "10").want(t, exitUsage)
	var prio int
	if err := b.pool.QueryRow(context.Background(),
		`SELECT priority FROM delayq_outbox WHERE queue = 'mail' AND task_id = 'm-5'`).Scan(&prio); err != nil || prio != 9 {
		t.Errorf("m-5 priority %d, %v", prio, err)
	}
	b.run(t, "enqueue", "--queue", "mail", "--id", "m-4", "--at", "2030-01-02T03:04:05Z", "--start-by", "2030-01-01T00:00:00Z").want(t, exitUsage)
	var startBy time.Time
	if err := b.pool.QueryRow(context.Background(),
		`SELECT start_by FROM delayq_outbox WHERE queue = 'mail' AND task_id = 'm-3'`).Scan(&startBy); err != nil ||
		!startBy.Equal(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("m-3 start_by %v, %v", startBy, err)
	}

	// Reschedule: new run time and version, back to pending.
	b.run(t, "reschedule", "--queue", "mail", "--id", "m-1", "--at", "2031-01-01T00:00:00Z").
		want(t, exitOK, "rescheduled mail/m-1 to 2031-01-01T00:00:00Z")
	var version int
	if err := b.pool.QueryRow(context.Background(),
		`SELECT version, run_at FROM delayq_outbox WHERE queue = 'mail' AND task_id = 'm-1'`).Scan(&version, &runAt); err != nil {
		t.Fatal(err)
	}
	if version != 2 || runAt.Year() != 2031 {
		t.Errorf("after reschedule: v%d at %v", version, runAt)
	}

	// Cancel: also removed from Redis at once.
	if _, err := b.dq.Enqueue(context.Background(), "mail", dispatch.Task{ID: "m-1", Version: 2}); err != nil {
		t.Fatal(err)
	}
	b.run(t, "cancel", "--queue", "mail", "--id", "m-1", "--prefix", b.prefix).
		want(t, exitOK, "cancelled mail/m-1 and removed it from Redis")
	if n := b.rdb.Exists(context.Background(), b.prefix+":{mail}:t:m-1").Val(); n != 0 {
		t.Error("m-1 still in Redis")
	}
	r := b.run(t, "cancel", "--queue", "mail", "--id", "m-1", "--prefix", b.prefix)
	r.want(t, exitFailure)
	r.oneLineErr(t, "already finished")
	r = cliRun(t, map[string]string{"DATABASE_URL": b.env["DATABASE_URL"]}, "cancel", "--queue", "mail", "--id", "m-2")
	r.want(t, exitOK, "the next reconcile removes it")
	r = b.run(t, "reschedule", "--queue", "mail", "--id", "nope", "--delay", "1m")
	r.want(t, exitFailure)
	r.oneLineErr(t, "not found")
}

func TestReconcileCheckStatsCommands(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	// Three queued rows that Redis lost, and a Redis orphan.
	b.exec(t, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, attempt)
SELECT 'pay', 'o-' || i, now() - interval '1 minute', 'p', 5, 'queued', 1 FROM generate_series(1, 3) AS i`)
	if _, err := b.dq.Enqueue(context.Background(), "pay", dispatch.Task{ID: "orphan"}); err != nil {
		t.Fatal(err)
	}
	p := []string{"--prefix", b.prefix}

	r := b.run(t, append([]string{"check"}, p...)...)
	r.want(t, exitFailure, "missing_in_redis", "pay", "o-2", "unknown_in_postgres", "orphan")
	r.oneLineErr(t, "4 inconsistencies found")
	r = b.run(t, append([]string{"check", "--json"}, p...)...)
	r.want(t, exitFailure)
	var incs []reconcile.Inconsistency
	if err := json.Unmarshal([]byte(r.stdout), &incs); err != nil || len(incs) != 4 {
		t.Fatalf("check --json: %v %s", err, r.stdout)
	}

	b.run(t, append([]string{"reconcile", "--dry-run"}, p...)...).
		want(t, exitOK, "dry run: nothing changed", "missing_in_redis", "total: 4 found, 4 would be repaired")
	b.run(t, append([]string{"check"}, p...)...).want(t, exitFailure)

	r = b.run(t, append([]string{"reconcile", "--json", "--queue", "pay"}, p...)...)
	r.want(t, exitOK)
	var rep reconcile.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("reconcile --json: %v\n%s", err, r.stdout)
	}
	if rep.Repaired != 4 || rep.Kinds[reconcile.MissingInRedis].Repaired != 3 || rep.Kinds[reconcile.UnknownInPostgres].Repaired != 1 {
		t.Errorf("report %+v", rep)
	}
	if r.stderr != "" {
		t.Errorf("progress on a non-terminal stderr: %q", r.stderr)
	}
	b.run(t, append([]string{"check"}, p...)...).want(t, exitOK, "consistent: no inconsistencies")
	b.run(t, append([]string{"reconcile"}, p...)...).want(t, exitOK, "no inconsistencies")

	r = b.run(t, append([]string{"stats"}, p...)...)
	r.want(t, exitOK, "QUEUE", "PENDING-AGE", "LATENESS")
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 2 || !strings.HasPrefix(strings.TrimSpace(lines[1]), "pay") {
		t.Errorf("stats table:\n%s", r.stdout)
	}
	r = b.run(t, append([]string{"stats", "--json"}, p...)...)
	r.want(t, exitOK)
	var st []reconcile.QueueStats
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st) != 1 {
		t.Fatalf("stats --json: %v %s", err, r.stdout)
	}
	if st[0].Postgres["queued"] != 3 || st[0].Ready != 3 || st[0].DueNow != 3 || st[0].OldestDueLateness < 59*time.Second {
		t.Errorf("stats %+v", st[0])
	}
}

// TestDatabaseKeyCommands: --database-key (several outbox databases on one
// Redis) names the database's keys, PREFIX:KEY, and nothing outside them.
func TestDatabaseKeyCommands(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	eu, err := dispatch.New(b.rdb, dispatch.Config{Prefix: b.prefix + ":eu1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eu.Enqueue(context.Background(), "pay", dispatch.Task{ID: "orphan-eu1"}); err != nil {
		t.Fatal(err)
	}
	b.run(t, "check", "--prefix", b.prefix, "--database-key", "eu1").want(t, exitFailure, "unknown_in_postgres", "orphan-eu1")
	b.run(t, "check", "--prefix", b.prefix, "--database-key", "us1").want(t, exitOK, "consistent")
	b.run(t, "check", "--prefix", b.prefix).want(t, exitOK, "consistent")
	env := map[string]string{"DATABASE_URL": b.env["DATABASE_URL"], "REDIS_URL": b.env["REDIS_URL"], "DELAYQ_DATABASE_KEY": "eu1"}
	cliRun(t, env, "check", "--prefix", b.prefix).want(t, exitFailure, "orphan-eu1")
}

func TestDeadCommands(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	b.exec(t, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, attempt, last_error, done_at)
SELECT 'pay', 'd-' || i, now(), 'p', 3, 'dead', 3, 'card declined
(line 2)', now() - i * interval '1 minute' FROM generate_series(1, 4) AS i`)
	p := []string{"--prefix", b.prefix}

	r := b.run(t, "dead", "list")
	r.want(t, exitOK, "QUEUE", "ATTEMPTS", "DIED AT", "LAST ERROR", "d-1", "3/3", "card declined (line 2)")
	if strings.Index(r.stdout, "d-1") > strings.Index(r.stdout, "d-2") {
		t.Errorf("not newest first:\n%s", r.stdout)
	}
	r = b.run(t, "dead", "list", "--json", "--limit", "2")
	r.want(t, exitOK)
	var dead []reconcile.DeadTask
	if err := json.Unmarshal([]byte(r.stdout), &dead); err != nil || len(dead) != 2 || dead[0].ID != "d-1" {
		t.Fatalf("dead list --json: %v %s", err, r.stdout)
	}

	b.run(t, append([]string{"dead", "retry", "--queue", "pay", "d-1"}, p...)...).
		want(t, exitOK, "retried pay/d-1: due now as a new version, attempts reset")
	// Flags after the id work as well.
	r = b.run(t, append([]string{"dead", "retry", "d-1", "--queue", "pay"}, p...)...)
	r.want(t, exitFailure)
	r.oneLineErr(t, "not dead")
	var state string
	var attempt int
	if err := b.pool.QueryRow(context.Background(),
		`SELECT state, attempt FROM delayq_outbox WHERE queue = 'pay' AND task_id = 'd-1'`).Scan(&state, &attempt); err != nil {
		t.Fatal(err)
	}
	// Postgres alone: pending as a new version; the relay moves it.
	if state != "pending" || attempt != 0 {
		t.Errorf("d-1 after retry: %s attempt %d, want pending attempt 0", state, attempt)
	}
	b.run(t, append([]string{"dead", "retry", "--all", "--queue", "pay"}, p...)...).want(t, exitOK, "retried 3 dead tasks")
	b.run(t, "dead", "list").want(t, exitOK, "no dead tasks")

	b.exec(t, `UPDATE delayq_outbox SET state = 'dead' WHERE task_id IN ('d-3', 'd-4')`)
	r = b.run(t, append([]string{"dead", "purge"}, p...)...)
	r.want(t, exitUsage)
	r.oneLineErr(t, "add --yes")
	b.run(t, append([]string{"dead", "purge", "--yes", "--queue", "pay", "d-3"}, p...)...).want(t, exitOK, "purged pay/d-3")
	b.run(t, append([]string{"dead", "purge", "--yes"}, p...)...).want(t, exitOK, "purged 1 dead tasks")
	if info, _ := b.dq.Inspect(context.Background(), "pay", "d-4"); info[0].State != dispatch.StateMissing {
		t.Errorf("d-4 still in Redis: %+v", info[0])
	}
}

// TestBinary runs the command built for the tests (cliBinary) as a process: exit codes, one-line
// errors, help.
func TestBinary(t *testing.T) {
	t.Parallel()
	bin := cliBinary(t)
	runBin := func(t *testing.T, env map[string]string, args ...string) cliResult {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")} // nothing else leaks in
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return cliResult{code: code, stdout: out.String(), stderr: errOut.String()}
	}

	t.Run("help", func(t *testing.T) {
		t.Parallel()
		r := runBin(t, nil, "--help")
		r.want(t, exitOK, "reconcile", "check", "stats", "dead", "enqueue", "cancel", "reschedule")
		runBin(t, nil).want(t, exitUsage, "Usage: delayq <command>")
		for _, cmd := range [][]string{{"reconcile"}, {"check"}, {"stats"}, {"enqueue"}, {"cancel"}, {"reschedule"},
			{"dead", "list"}, {"dead", "retry"}, {"dead", "purge"}} {
			r := runBin(t, nil, append(cmd, "--help")...)
			r.want(t, exitOK, "Usage: delayq "+cmd[0], "Examples:", "Flags:", "DATABASE_URL", "Exit codes: 0 ok, 1 failure, 2 usage error")
			if r.stderr != "" {
				t.Errorf("%v --help wrote to stderr: %q", cmd, r.stderr)
			}
		}
		runBin(t, nil, "dead", "--help").want(t, exitOK, "list", "retry", "purge", "attempts reset", "Exit codes")
	})

	t.Run("usage errors", func(t *testing.T) {
		t.Parallel()
		env := map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/x", "REDIS_URL": "redis://127.0.0.1:1"}
		for _, c := range []struct {
			args []string
			has  string
		}{
			{[]string{"nope"}, "unknown command"},
			{[]string{"reconcile", "--nope"}, "unknown flag --nope"},
			{[]string{"reconcile", "--batch"}, "flag --batch needs a value"},
			{[]string{"reconcile", "extra"}, "unexpected argument"},
			{[]string{"reconcile", "--queue", "a{b"}, "invalid queue name"},
			{[]string{"reconcile", "--batch", "0"}, "--batch 0"},
			{[]string{"reconcile", "--grace", "-5s"}, "Grace -5s"},
			{[]string{"check", "--batch", "1001"}, "--batch 1001"},
			{[]string{"reconcile", "--prefix", "a b"}, "--prefix"},
			{[]string{"check", "--database-key", "EU:1"}, "--database-key: invalid database key"},
			{[]string{"check", "--schema", "Bad-Schema"}, `Schema "Bad-Schema"`},
			{[]string{"stats", "--json=maybe"}, `--json "maybe": want true or false`},
			{[]string{"dead"}, "want an action"},
			{[]string{"dead", "bury"}, "unknown action"},
			{[]string{"dead", "retry", "x"}, "needs --queue"},
			{[]string{"dead", "retry", "--all", "x"}, "not both"},
			{[]string{"dead", "purge", "--queue", "q", "x"}, "add --yes"},
			{[]string{"dead", "list", "--limit", "0"}, "--limit"},
			{[]string{"enqueue", "--queue", "q"}, "--queue and --id are required"},
			{[]string{"enqueue", "--queue", "q", "--id", "a b"}, "invalid task id"},
			{[]string{"enqueue", "--queue", "q", "--id", "x", "--delay", "1s", "--at", "2030-01-01T00:00:00Z"}, "not both"},
			{[]string{"enqueue", "--queue", "q", "--id", "x", "--at", "tomorrow"}, "RFC 3339"},
			{[]string{"enqueue", "--queue", "q", "--id", "x", "--delay", "-1s"}, "negative"},
			{[]string{"enqueue", "--queue", "q", "--id", "x", "--max-attempts", "-1"}, "max attempts"},
			{[]string{"enqueue", "--queue", "q", "--id", "x", "--payload", "a", "--payload-file", "f"}, "not both"},
			{[]string{"reschedule", "--queue", "q", "--id", "x"}, "--delay or --at is required"},
			{[]string{"cancel", "--id", "x"}, "required"},
		} {
			r := runBin(t, env, c.args...)
			if r.code != exitUsage {
				t.Errorf("%v: exit %d, want 2 (stderr %q)", c.args, r.code, r.stderr)
				continue
			}
			r.oneLineErr(t, c.has)
		}
		r := runBin(t, nil, "check")
		r.want(t, exitUsage)
		r.oneLineErr(t, "no PostgreSQL URL")
		r = runBin(t, map[string]string{"DATABASE_URL": "postgres://u:secret@[oops"}, "stats")
		r.want(t, exitUsage)
		r.oneLineErr(t, "malformed PostgreSQL URL")
	})

	t.Run("bad URL", func(t *testing.T) {
		t.Parallel()
		dbURL := testenv.PostgresURL(t)
		for _, c := range []struct {
			env  map[string]string
			args []string
			has  string
		}{
			{map[string]string{"DATABASE_URL": "postgres://u:secret@127.0.0.1:1/db", "REDIS_URL": "redis://127.0.0.1:1"},
				[]string{"reconcile"}, "PostgreSQL postgres://u:xxxxx@127.0.0.1:1/db unreachable"},
			{map[string]string{"DATABASE_URL": dbURL, "REDIS_URL": "redis://:secret@127.0.0.1:1"},
				[]string{"check"}, "Redis redis://:xxxxx@127.0.0.1:1 unreachable"},
			{map[string]string{"DATABASE_URL": "postgres://u:secret@127.0.0.1:1/db"},
				[]string{"enqueue", "--queue", "q", "--id", "x"}, "unreachable"},
			{map[string]string{"DATABASE_URL": "postgres://u:secret@127.0.0.1:1/db"},
				[]string{"dead", "list"}, "unreachable"},
		} {
			r := runBin(t, c.env, c.args...)
			if r.code != exitFailure {
				t.Errorf("%v: exit %d, want 1 (stderr %q)", c.args, r.code, r.stderr)
				continue
			}
			r.oneLineErr(t, c.has)
			if strings.Contains(r.stderr, "secret") {
				t.Errorf("%v: password on stderr: %q", c.args, r.stderr)
			}
		}
	})

	// The one line a user meets for each wrong set-up: what is wrong, in the
	// server's words where it refused, and the fix where there is one.
	t.Run("wrong set-up", func(t *testing.T) {
		t.Parallel()
		dbURL := testenv.PostgresURL(t)
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		u.Path = "/delayq_no_such_database"
		noDB := u.String()
		redisURL := testenv.RedisURL(t)
		for _, c := range []struct {
			name string
			env  map[string]string
			args []string
			code int
			has  string
			not  string
		}{
			{"missing database", map[string]string{"DATABASE_URL": noDB, "REDIS_URL": redisURL}, []string{"stats"}, exitFailure,
				`refused the connection: database "delayq_no_such_database" does not exist (SQLSTATE 3D000) (create it`, "tls"},
			{"missing table", map[string]string{"DATABASE_URL": testenv.EmptyPostgresURL(t), "REDIS_URL": redisURL},
				[]string{"enqueue", "--queue", "q", "--id", "x"}, exitFailure, "(run the migrations: delayq migrate up)", ""},
			{"another database's URL", map[string]string{"DATABASE_URL": "mysql://app@127.0.0.1/x", "REDIS_URL": redisURL},
				[]string{"stats"}, exitUsage, `scheme "mysql", want postgres:// or postgresql://`, "xxxxx"},
			{"nothing listening", map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1:1/db", "REDIS_URL": redisURL},
				[]string{"stats"}, exitFailure, "unreachable: dial tcp 127.0.0.1:1: connect: connection refused", "dial error"},
		} {
			r := runBin(t, c.env, c.args...)
			if r.code != c.code {
				t.Errorf("%s: exit %d, want %d (stderr %q)", c.name, r.code, c.code, r.stderr)
				continue
			}
			r.oneLineErr(t, c.has)
			if c.not != "" && strings.Contains(r.stderr, c.not) {
				t.Errorf("%s: stderr %q has %q", c.name, r.stderr, c.not)
			}
		}
	})

	t.Run("the line of each error", func(t *testing.T) {
		t.Parallel()
		testErrorLines(t, runBin)
	})

	t.Run("check exit code", func(t *testing.T) {
		t.Parallel()
		b := newCLIBundle(t)
		b.exec(t, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state)
VALUES ('q', 'lost', now(), 'p', 5, 'queued')`)
		r := runBin(t, b.env, "check", "--prefix", b.prefix)
		r.want(t, exitFailure, "missing_in_redis", "lost")
		r.oneLineErr(t, "1 inconsistencies found")
		runBin(t, b.env, "reconcile", "--prefix", b.prefix).want(t, exitOK, "missing_in_redis")
		runBin(t, b.env, "check", "--prefix", b.prefix).want(t, exitOK, "consistent")
	})
}

func TestParseArgs(t *testing.T) {
	t.Parallel()
	m := NewMain(&bytes.Buffer{}, &bytes.Buffer{}, func(string) string { return "" })
	for _, c := range []struct {
		args []string
		want string
		n    int
	}{
		{[]string{"a", "--queue", "q", "b"}, "a b", -1},
		{[]string{"--queue", "q", "--", "--weird"}, "--weird", 1},
		{[]string{}, "", 0},
	} {
		fs := newFlagSet(m, "x", "x", "")
		var q queueList
		fs.Var(&q, "queue", "")
		if err := parseArgs(fs, c.args, c.n); err != nil {
			t.Errorf("%v: %v", c.args, err)
			continue
		}
		if got := strings.Join(fs.Args(), " "); got != c.want || q.String() != "q" && len(c.args) > 0 {
			t.Errorf("%v: args %q queue %q", c.args, got, q.String())
		}
	}
	fs := newFlagSet(m, "x", "x", "")
	if err := parseArgs(fs, []string{"a", "b"}, 1); err == nil || !strings.Contains(err.Error(), `unexpected argument "b"`) {
		t.Errorf("two arguments for one: %v", err)
	}
	if err := parseArgs(newFlagSet(m, "x", "x", ""), nil, 1); err == nil {
		t.Error("no argument for one: no error")
	}
}

func TestProgressLine(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	p := newProgressLine(&buf)
	p.clear() // nothing shown: nothing to clear
	p.show(reconcile.Progress{Queue: "pay", Phase: "postgres", Done: 500, Total: 2000, QueueIndex: 1, Queues: 2, Found: 3})
	p.show(reconcile.Progress{Queue: "pay", Phase: "postgres", Done: 1000, Total: 2000, QueueIndex: 1, Queues: 2}) // too soon
	p.clear()
	if want := "\r\033[Kqueue 1/2 pay: postgres 500/2000 rows, 3 found\r\033[K"; buf.String() != want {
		t.Errorf("progress output %q, want %q", buf.String(), want)
	}
	if isTerminal(&buf) {
		t.Error("a buffer is not a terminal")
	}
}
