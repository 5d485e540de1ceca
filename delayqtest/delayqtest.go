// Package delayqtest helps applications test their delayq code against real
// servers, as rivertest does for River:
//
//   - New gives a test a migrated database and a Redis key prefix of its own,
//     dropped when the test ends, and Env.Client a delayq client on them;
//   - RequireEnqueued and RequireNotEnqueued assert what a transaction enqueued
//     (queue, id, payload, due time), on pgx or database/sql;
//   - Env.Work runs one enqueued task's handler now, synchronously, through a
//     real worker (middleware, the completion guard and commit, hooks, the Redis
//     ack), whatever its due time and its state in Redis, so a test can run a
//     task that failed again; Env.WorkLastAttempt runs it as its last attempt,
//     to test a queue's OnDead hook.
//
// # Servers
//
// New uses the servers named by DELAYQ_TEST_POSTGRES_URL and
// DELAYQ_TEST_REDIS_URL (or Options). Where one is not set, it starts one,
// once for all the tests of the test binary, with the finder of delayq's make
// demo: from the local PostgreSQL (initdb, postgres) or Redis (redis-server)
// binaries, found on PATH or where distributions put them
// (/usr/lib/postgresql/*/bin), else in a Docker container (postgres:15,
// redis:7) through the docker command. So `go test` needs no set-up on a
// machine with the binaries (Debian/Ubuntu: apt-get install postgresql
// redis-server; macOS: brew install postgresql redis) or with Docker.
// DELAYQ_TEST_SERVERS=local or docker picks one of the two. Without binaries,
// Docker or URLs the test fails with one message saying so (or is skipped:
// Options.Skip). `delayq dev` starts the same servers for a shell and prints
// the variables to export.
//
// The servers are throwaway: in a temporary directory, without durability. Call
// Main from the package's TestMain to stop them and remove their files when the
// tests end:
//
//	func TestMain(m *testing.M) { delayqtest.Main(m) }
//
// Without it, on Linux, the servers die with the test process, and the next
// test process that starts servers removes the files left behind; elsewhere
// they outlive it.
//
// The package links no Docker client (it would land in every user's go.sum):
// it runs the docker command. Containers are labelled with the test process
// that started them and removed by Main, else by the next test process that
// starts servers.
package delayqtest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/transition"
	"github.com/delayq/delayq/migrations"
	"github.com/delayq/delayq/outbox"
)

// The environment variables New reads when Options leaves a URL empty.
const (
	EnvPostgresURL = "DELAYQ_TEST_POSTGRES_URL"
	EnvRedisURL    = "DELAYQ_TEST_REDIS_URL"
)

// Options name the servers. The zero value reads the environment, and starts
// local servers where it names none.
type Options struct {
	// PostgresURL is a server the test may create databases on (the database in
	// the URL is only connected to). Default: $DELAYQ_TEST_POSTGRES_URL, else a
	// local server (see the package documentation).
	PostgresURL string
	// RedisURL is a Redis the test may write keys under a prefix of its own to.
	// Default: $DELAYQ_TEST_REDIS_URL, else a local server.
	RedisURL string
	// Skip, when set, skips the test when there is no server to use (no URL and
	// no local binaries); by default the test fails.
	Skip bool
}

// Main runs the tests of a package and then stops the servers New started, if
// any: call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	stopLocal()
	os.Exit(code)
}

// Env is one test's database and Redis prefix. Everything is closed, dropped or
// deleted when the test ends. Env.Client gives a delayq client on them.
type Env struct {
	// URL is the test's own database, migrated.
	URL string
	// Pool is a pool on URL: the application's tables, and the transactions
	// under test.
	Pool *pgxpool.Pool
	// Redis is a client of the test's Redis; the test's keys begin with Prefix.
	Redis  *redis.Client
	Prefix string

	dq *dispatch.Client // the Redis side, for Work's expedite
}

// New creates the test's database and Redis prefix, on the servers Options
// names, else on local ones it starts (once a test binary).
func New(t testing.TB, o Options) *Env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	pgURL, redisURL, err := serverURLs(ctx, o)
	if err != nil {
		if o.Skip {
			t.Skip(noServers(err))
		}
		t.Fatal(noServers(err))
	}
	name := "delayqtest_" + randomHex(t, 8)
	e := &Env{Prefix: "dqt:" + name[len("delayqtest_"):]}

	admin, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		t.Fatalf("delayqtest: connect to postgres: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("delayqtest: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := pgx.Connect(ctx, pgURL)
		if err != nil {
			t.Logf("delayqtest: drop database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("delayqtest: drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(pgURL)
	if err != nil {
		t.Fatalf("delayqtest: postgres URL: %v", err)
	}
	u.Path = "/" + name
	e.URL = u.String()
	db, err := migrations.OpenDB(e.URL)
	if err != nil {
		t.Fatalf("delayqtest: %v", err)
	}
	_, err = migrations.Up(ctx, db, migrations.Config{})
	db.Close()
	if err != nil {
		t.Fatalf("delayqtest: migrate: %v", err)
	}
	if e.Pool, err = pgxpool.New(ctx, e.URL); err != nil {
		t.Fatalf("delayqtest: %v", err)
	}
	t.Cleanup(e.Pool.Close) // before the drop: cleanups run last first

	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		t.Fatalf("delayqtest: redis URL: %v", err)
	}
	e.Redis = redis.NewClient(opt)
	t.Cleanup(func() { deletePrefix(e.Redis, e.Prefix); _ = e.Redis.Close() })
	if e.dq, err = dispatch.New(e.Redis, dispatch.Config{Prefix: e.Prefix}); err != nil {
		t.Fatalf("delayqtest: %v", err)
	}
	return e
}

// serverURLs returns the URLs Options or the environment give, and starts local
// servers for those they do not.
func serverURLs(ctx context.Context, o Options) (pg, rdb string, err error) {
	pg, rdb = cmp.Or(o.PostgresURL, os.Getenv(EnvPostgresURL)), cmp.Or(o.RedisURL, os.Getenv(EnvRedisURL))
	if pg == "" {
		if pg, err = localPostgres(ctx); err != nil {
			return "", "", err
		}
	}
	if rdb == "" {
		if rdb, err = localRedis(ctx); err != nil {
			return "", "", err
		}
	}
	return pg, rdb, nil
}

// Client returns a delayq client on the test's servers with cfg, whose Prefix
// is the test's (cfg.Prefix is ignored; the schema must be the default one).
func (e *Env) Client(t testing.TB, cfg delayq.Config) *delayq.Client {
	t.Helper()
	cfg.Prefix = e.Prefix
	c, err := delayq.New(e.Pool, e.Redis, cfg)
	if err != nil {
		t.Fatalf("delayqtest: %v", err)
	}
	return c
}

// Work runs the task queue/id, committed in the outbox, through c's handler, now
// and synchronously, whatever its due time and whatever Redis holds for it (a
// retry's backoff, a snooze, a run whose lease it takes over): it makes the task
// due at once in Redis, as the relay encodes it, and calls c.Work, so the run
// goes through the middleware, the handler, the completion guard and commit, the
// hooks and the Redis ack or retry. A task that failed can be run again; its
// attempts count on. It fails the test when the task is not in the outbox, is
// finished, or another task ran. The result says how the run ended.
func (e *Env) Work(ctx context.Context, t testing.TB, c *delayq.Client, queue, id string) delayq.WorkResult {
	t.Helper()
	return e.work(ctx, t, c, queue, id, false)
}

// WorkLastAttempt is Work as the task's last attempt: a failure makes it dead
// and runs the queue's OnDead hook, as after MaxAttempts failed runs. (The
// attempts before it are not run.)
func (e *Env) WorkLastAttempt(ctx context.Context, t testing.TB, c *delayq.Client, queue, id string) delayq.WorkResult {
	t.Helper()
	return e.work(ctx, t, c, queue, id, true)
}

func (e *Env) work(ctx context.Context, t testing.TB, c *delayq.Client, queue, id string, last bool) delayq.WorkResult {
	t.Helper()
	rows, err := e.Pool.Query(ctx, statements.Lookup, queue, []string{id})
	if err != nil {
		t.Fatalf("delayqtest: read the outbox: %v", err)
	}
	found, err := pgx.CollectRows(rows, taskstate.ScanRow)
	if err != nil {
		t.Fatalf("delayqtest: read the outbox: %v", err)
	}
	if len(found) == 0 {
		t.Fatalf("delayqtest: no task %s/%s in the outbox (was its transaction committed?)", queue, id)
	}
	r := found[0]
	if !r.State.Live() {
		t.Fatalf("delayqtest: task %s/%s is %s", queue, id, r.State)
	}
	if last {
		r.Attempt = r.MaxAttempts - 1 // the claim counts the last one
	}
	ops := transition.New(taskstate.New(taskstate.Config{Schema: taskstate.DefaultSchema, NotifyChannel: taskstate.DefaultNotifyChannel}), e.dq)
	if err := ops.Expedite(ctx, queue, r); err != nil {
		t.Fatalf("delayqtest: make %s/%s due in redis: %v", queue, id, err)
	}
	res, err := c.Work(ctx, queue)
	if err != nil {
		t.Fatalf("delayqtest: work %s/%s: %v", queue, id, err)
	}
	if res.Task == nil || res.Task.ID != id {
		t.Fatalf("delayqtest: work %s/%s: ran %+v", queue, id, res.Task)
	}
	return res
}

// Want is what RequireEnqueued looks for.
type Want struct {
	// Queue is the task's queue (required).
	Queue string
	// ID is the task's id; "" matches any task of the queue.
	ID string
	// Payload checks the payload; nil matches any. See Equal and Match.
	Payload func(payload []byte) error
	// RunAt is when the task is due; zero matches any. Within is the tolerance
	// (default 1s).
	RunAt  time.Time
	Within time.Duration
}

// Enqueued is an outbox row a Require function found.
type Enqueued struct {
	Queue, ID   string
	State       delayqtype.State
	Version     int
	Attempt     int
	MaxAttempts int
	RunAt       time.Time
	Payload     []byte
}

// RequireEnqueued fails the test unless db (the transaction under test, before
// or after its commit) sees a task matching want, and returns the first match.
func RequireEnqueued(ctx context.Context, t testing.TB, db outbox.Querier, want Want) Enqueued {
	t.Helper()
	return requireEnqueued(t, want, find(ctx, t, db, want))
}

// RequireNotEnqueued fails the test if db sees a task matching want.
func RequireNotEnqueued(ctx context.Context, t testing.TB, db outbox.Querier, want Want) {
	t.Helper()
	requireNotEnqueued(t, want, find(ctx, t, db, want))
}

// RequireEnqueuedSQL is RequireEnqueued in a database/sql transaction.
func RequireEnqueuedSQL(ctx context.Context, t testing.TB, tx outbox.SQLQuerier, want Want) Enqueued {
	t.Helper()
	return requireEnqueued(t, want, findSQL(ctx, t, tx, want))
}

// RequireNotEnqueuedSQL is RequireNotEnqueued in a database/sql transaction.
func RequireNotEnqueuedSQL(ctx context.Context, t testing.TB, tx outbox.SQLQuerier, want Want) {
	t.Helper()
	requireNotEnqueued(t, want, findSQL(ctx, t, tx, want))
}

// Equal returns a payload check: the payload decodes (with q's codec) to a value
// deeply equal to want.
func Equal[T any](q outbox.Queue[T], want T) func([]byte) error {
	return Match(q, func(got T) error {
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("payload %+v, want %+v", got, want)
		}
		return nil
	})
}

// Match returns a payload check: the payload decodes (with q's codec) to a value
// check accepts.
func Match[T any](q outbox.Queue[T], check func(T) error) func([]byte) error {
	return func(p []byte) error {
		v, err := q.Decode(p)
		if err != nil {
			return err
		}
		return check(v)
	}
}

// maxRows bounds a search: a test's queue holds few tasks.
const maxRows = 10000

var statements = taskstate.NewStatements(taskstate.Config{Schema: taskstate.DefaultSchema, NotifyChannel: taskstate.DefaultNotifyChannel})

func find(ctx context.Context, t testing.TB, db outbox.Querier, want Want) []Enqueued {
	t.Helper()
	checkWant(t, want)
	rows, err := db.Query(ctx, statements.Find, want.Queue, want.ID, maxRows)
	if err != nil {
		t.Fatalf("delayqtest: read the outbox: %v", err)
	}
	defer rows.Close()
	return collect(t, rows, want.Queue)
}

func findSQL(ctx context.Context, t testing.TB, tx outbox.SQLQuerier, want Want) []Enqueued {
	t.Helper()
	checkWant(t, want)
	rows, err := tx.QueryContext(ctx, statements.Find, want.Queue, want.ID, maxRows)
	if err != nil {
		t.Fatalf("delayqtest: read the outbox: %v", err)
	}
	defer rows.Close()
	return collect(t, rows, want.Queue)
}

// rowScanner is what pgx.Rows and *sql.Rows share.
type rowScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// collect reads the rows of statements.Find.
func collect(t testing.TB, rows rowScanner, queue string) []Enqueued {
	t.Helper()
	var out []Enqueued
	for rows.Next() {
		e := Enqueued{Queue: queue}
		if err := rows.Scan(&e.ID, &e.State, &e.Version, &e.Attempt, &e.MaxAttempts, &e.RunAt, &e.Payload); err != nil {
			t.Fatalf("delayqtest: read the outbox: %v", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("delayqtest: read the outbox: %v", err)
	}
	return out
}

func checkWant(t testing.TB, want Want) {
	t.Helper()
	if want.Queue == "" {
		t.Fatal("delayqtest: Want.Queue is required")
	}
}

// mismatch says why e does not match want; "" when it does.
func mismatch(want Want, e Enqueued) string {
	if want.Payload != nil {
		if err := want.Payload(e.Payload); err != nil {
			return fmt.Sprintf("%s/%s: %v", e.Queue, e.ID, err)
		}
	}
	if !want.RunAt.IsZero() {
		within := want.Within
		if within == 0 {
			within = time.Second
		}
		if d := e.RunAt.Sub(want.RunAt); d > within || d < -within {
			return fmt.Sprintf("%s/%s: due %v, want %v (±%v)", e.Queue, e.ID, e.RunAt, want.RunAt, within)
		}
	}
	return ""
}

func requireEnqueued(t testing.TB, want Want, rows []Enqueued) Enqueued {
	t.Helper()
	var why []error
	for _, e := range rows {
		m := mismatch(want, e)
		if m == "" {
			return e
		}
		why = append(why, errors.New(m))
	}
	if len(rows) == 0 {
		t.Fatalf("delayqtest: no task enqueued into %q%s", want.Queue, idSuffix(want.ID))
	}
	t.Fatalf("delayqtest: no task of %q%s matches:\n%v", want.Queue, idSuffix(want.ID), errors.Join(why...))
	return Enqueued{}
}

func requireNotEnqueued(t testing.TB, want Want, rows []Enqueued) {
	t.Helper()
	for _, e := range rows {
		if mismatch(want, e) == "" {
			t.Fatalf("delayqtest: task %s/%s is enqueued (%s), want none", e.Queue, e.ID, e.State)
		}
	}
}

func idSuffix(id string) string {
	if id == "" {
		return ""
	}
	return " with id " + id
}

func randomHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("delayqtest: %v", err)
	}
	return hex.EncodeToString(b)
}

// deletePrefix deletes the test's Redis keys.
func deletePrefix(rdb *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 1000 {
			rdb.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		rdb.Unlink(ctx, batch...)
	}
}
