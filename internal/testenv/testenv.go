// Package testenv gives every test real PostgreSQL and Redis servers, isolated per
// test: its own database (cloned from a migrated template, so it is fast) and its own
// Redis key prefix, so tests and packages run in parallel.
//
// Servers come from, in order: DELAYQ_TEST_POSTGRES_URL / DELAYQ_TEST_REDIS_URL
// (servers you run, or the containers `make test` starts in Docker where no server
// binaries are installed; databases are created on them), else throwaway servers
// started from local binaries (see internal/tempserver), shared by the tests of one
// package and stopped by Main. Fault tests ask for servers of their own with
// OwnPostgres and OwnRedis.
package testenv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/delayq/delayq/internal/tempserver"
)

// Environment variables naming servers the tests use instead of starting their own.
const (
	PostgresURLEnv = "DELAYQ_TEST_POSTGRES_URL"
	RedisURLEnv    = "DELAYQ_TEST_REDIS_URL"
)

// env is the state of one test binary: its shared servers and template database.
type env struct {
	pgOnce   sync.Once
	pgURL    string // server URL (database "postgres" or the one given)
	template string // migrated template database
	pgErr    error
	pgServer *tempserver.Postgres

	redisOnce   sync.Once
	redisURL    string
	redisErr    error
	redisServer *tempserver.Redis

	seq atomic.Int64
}

// shared is the process's test environment. A package-level variable is the one
// way to share servers across the tests of one binary; it is unexported and only
// test binaries link this package.
var shared env

// Main runs the tests of a package, then runs cleanups (what the package's tests
// shared: a built binary, say), stops the servers they shared and checks that no
// goroutine leaked. Call it from TestMain.
func Main(m *testing.M, cleanups ...func()) {
	before := goleak.IgnoreCurrent()
	code := m.Run()
	for _, c := range cleanups {
		c()
	}
	shared.close()
	if code == 0 {
		// Find retries for about 0.4 s; go-redis's background redial sleeps a
		// whole second before it sees its pool closed and returns, so a test that
		// killed a server needs a few rounds. A real leak outlives them all.
		var err error
		for range 8 { // about 3.5 s in all
			if err = goleak.Find(before); err == nil {
				break
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func (e *env) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if e.template != "" {
		_ = tempserver.DropDatabase(ctx, e.pgURL, e.template)
	}
	if e.pgServer != nil {
		e.pgServer.Close()
	}
	if e.redisServer != nil {
		e.redisServer.Close()
	}
}

func (e *env) postgres(t testing.TB) (serverURL, template string) {
	t.Helper()
	e.pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		e.pgURL = os.Getenv(PostgresURLEnv)
		if e.pgURL == "" {
			e.pgServer, e.pgErr = tempserver.StartPostgres(ctx, tempserver.PostgresOptions{})
			if e.pgErr != nil {
				return
			}
			e.pgURL = e.pgServer.URL()
		}
		e.template = fmt.Sprintf("dq_tmpl_%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
		var tmplURL string
		tmplURL, e.pgErr = tempserver.CreateDatabase(ctx, e.pgURL, e.template, "")
		if e.pgErr != nil {
			return
		}
		e.pgErr = migrate(ctx, tmplURL)
	})
	if e.pgErr != nil {
		t.Fatalf("testenv: PostgreSQL: %v", e.pgErr)
	}
	return e.pgURL, e.template
}

func (e *env) redis(t testing.TB) string {
	t.Helper()
	e.redisOnce.Do(func() {
		e.redisURL = os.Getenv(RedisURLEnv)
		if e.redisURL != "" {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		e.redisServer, e.redisErr = tempserver.StartRedis(ctx, tempserver.RedisOptions{})
		if e.redisErr == nil {
			e.redisURL = e.redisServer.URL()
		}
	})
	if e.redisErr != nil {
		t.Fatalf("testenv: Redis: %v", e.redisErr)
	}
	return e.redisURL
}

// name returns a name unique in this process and across processes sharing a server.
func (e *env) name(t testing.TB, kind string) string {
	base := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '_'
	}, t.Name())
	if len(base) > 30 {
		base = base[:30]
	}
	return fmt.Sprintf("%s_%d_%d_%s", kind, os.Getpid(), e.seq.Add(1), base)
}

// PostgresURL creates a fresh, migrated database for this test and returns its URL.
// The database is dropped when the test ends.
func PostgresURL(t testing.TB) string {
	t.Helper()
	serverURL, template := shared.postgres(t)
	return newDatabase(t, serverURL, template)
}

// EmptyPostgresURL creates a fresh database with no migrations applied.
func EmptyPostgresURL(t testing.TB) string {
	t.Helper()
	serverURL, _ := shared.postgres(t)
	return newDatabase(t, serverURL, "")
}

func newDatabase(t testing.TB, serverURL, template string) string {
	t.Helper()
	ctx := context.Background()
	name := shared.name(t, "t")
	u, err := tempserver.CreateDatabase(ctx, serverURL, name, template)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		if err := tempserver.DropDatabase(context.Background(), serverURL, name); err != nil {
			t.Logf("testenv: drop database %s: %v", name, err)
		}
	})
	return u
}

// Postgres returns a pool on a fresh, migrated database of this test's own.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return Pool(t, PostgresURL(t))
}

// Pool opens a pool on url, closed when the test ends.
func Pool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("testenv: pgxpool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// RedisURL is the URL of the shared test Redis server.
func RedisURL(t testing.TB) string {
	t.Helper()
	return shared.redis(t)
}

// Redis returns a client on the shared test Redis and a key prefix only this test
// uses. The prefix's keys are deleted when the test ends.
func Redis(t testing.TB) (*redis.Client, string) {
	t.Helper()
	rdb := RedisClient(t, shared.redis(t))
	prefix := fmt.Sprintf("t%d.%d", os.Getpid(), shared.seq.Add(1))
	t.Cleanup(func() { deletePrefix(rdb, prefix) })
	return rdb, prefix
}

// RedisClient opens a client on url, closed when the test ends.
func RedisClient(t testing.TB, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("testenv: redis URL: %v", err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func deletePrefix(rdb *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			rdb.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		rdb.Unlink(ctx, batch...)
	}
}

// OwnRedis starts a Redis server only this test uses, so it may stop, kill and
// restart it. It is removed when the test ends.
func OwnRedis(t testing.TB, args ...string) *tempserver.Redis {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := tempserver.StartRedis(ctx, tempserver.RedisOptions{Args: args})
	if err != nil {
		t.Fatalf("testenv: own Redis: %v", err)
	}
	t.Cleanup(r.Close)
	return r
}

// OwnPostgres starts a PostgreSQL server only this test uses, with the delayq
// schema migrated in its database "postgres". It is removed when the test ends.
func OwnPostgres(t testing.TB) *tempserver.Postgres {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := tempserver.StartPostgres(ctx, tempserver.PostgresOptions{})
	if err != nil {
		t.Fatalf("testenv: own PostgreSQL: %v", err)
	}
	t.Cleanup(pg.Close)
	if err := migrate(ctx, pg.URL()); err != nil {
		t.Fatalf("testenv: migrate own PostgreSQL: %v", err)
	}
	return pg
}
