package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/validate"
)

// connFlags are the connection flags most subcommands share.
type connFlags struct {
	databaseURL string
	redisURL    string
	schema      string
	prefix      string
	database    string // several outbox databases: this one's key (keys under prefix:database)
}

func (c *connFlags) register(fs *flagSet, m *Main, needDB, needRedis bool) {
	if needDB {
		c.databaseURL = m.Getenv("DATABASE_URL")
		fs.Var(urlFlag{&c.databaseURL}, "database-url", "PostgreSQL `URL` (env DATABASE_URL)")
		fs.StringVar(&c.schema, "schema", "public", "schema of the outbox table")
	}
	if needRedis {
		c.redisURL = m.Getenv("REDIS_URL")
		fs.Var(urlFlag{&c.redisURL}, "redis-url", "Redis `URL`, redis:// or rediss:// (env REDIS_URL)")
		fs.StringVar(&c.prefix, "prefix", "dq", "Redis key prefix")
		fs.StringVar(&c.database, "database-key", m.Getenv("DELAYQ_DATABASE_KEY"),
			"`KEY` of this outbox database when several feed one Redis: its keys are under PREFIX:KEY (env DELAYQ_DATABASE_KEY)")
	}
}

// namespace is the key prefix of this database's tasks.
func (c *connFlags) namespace() string { return dispatch.Namespace(c.prefix, c.database) }

// checkURLs parses the URLs given, so that a malformed one is reported here, with
// no password in the message, rather than by code further down that shows the
// parser's message as it is.
func (c *connFlags) checkURLs() error {
	if c.databaseURL != "" {
		if _, err := parsePostgresURL(c.databaseURL); err != nil {
			return err
		}
	}
	if c.redisURL != "" {
		if _, _, _, err := parseRedisURL(c.redisURL); err != nil {
			return err
		}
	}
	return nil
}

// checkPostgres checks that a PostgreSQL URL was given and parses, without
// connecting.
func (c *connFlags) checkPostgres() error {
	if c.databaseURL == "" {
		return usagef("no PostgreSQL URL: set DATABASE_URL or --database-url")
	}
	_, err := parsePostgresURL(c.databaseURL)
	return err
}

// checkRedis checks that a Redis URL was given and parses, without connecting.
func (c *connFlags) checkRedis() error {
	if c.redisURL == "" {
		return usagef("no Redis URL: set REDIS_URL or --redis-url")
	}
	if c.database != "" {
		if err := validate.Database(c.database); err != nil {
			return usagef("--database-key: %v", err)
		}
	}
	_, _, _, err := parseRedisURL(c.redisURL)
	return err
}

// openPostgres connects and pings, with errors in one line and no password.
func (c *connFlags) openPostgres(ctx context.Context) (*pgxpool.Pool, error) {
	if err := c.checkPostgres(); err != nil {
		return nil, err
	}
	cfg, _ := parsePostgresURL(c.databaseURL)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL %s: %w", redactURL(c.databaseURL), err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, connectError(redactURL(c.databaseURL), err)
	}
	return pool, nil
}

// connectError names why a connection failed in one line: the server's refusal
// (a missing database or role, a wrong password) as the server said it, not as
// "unreachable" behind the failed TLS attempt that pgx tried first; a failed dial
// once, not once for each address and TLS mode pgx tried.
func connectError(redactedURL string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		hint := ""
		switch pgErr.Code {
		case "3D000": // invalid_catalog_name
			hint = " (create it, e.g. createdb, or fix the URL's database name)"
		case "28000", "28P01": // invalid authorization, invalid password
			hint = " (check the URL's user and password)"
		}
		return fmt.Errorf("PostgreSQL %s refused the connection: %s (SQLSTATE %s)%s%w",
			redactedURL, pgErr.Message, pgErr.Code, hint, quiet{err})
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return fmt.Errorf("PostgreSQL %s unreachable: %s%w", redactedURL, opErr, quiet{err})
	}
	return fmt.Errorf("PostgreSQL %s unreachable: %w", redactedURL, err)
}

// quiet wraps an error for errors.Is and errors.As without adding to the message.
type quiet struct{ err error }

func (q quiet) Error() string { return "" }
func (q quiet) Unwrap() error { return q.err }

// openRedis connects and pings, with errors in one line and no password. go-redis
// logs every failed dial on its own before it returns the error, so a plain TCP
// dial first turns an unreachable server into one error line.
func (c *connFlags) openRedis(ctx context.Context) (redis.UniversalClient, error) {
	if err := c.checkRedis(); err != nil {
		return nil, err
	}
	newClient, network, addr, _ := parseRedisURL(c.redisURL)
	d := net.Dialer{Timeout: 10 * time.Second}
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		//lint:ignore ST1005 a name: the error starts with the server it is about, as PostgreSQL's do
		return nil, fmt.Errorf("Redis %s unreachable: %w", redactURL(c.redisURL), err)
	}
	_ = conn.Close()
	rdb := newClient()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		rdb.Close()
		//lint:ignore ST1005 a name: the error starts with the server it is about, as PostgreSQL's do
		return nil, fmt.Errorf("Redis %s unreachable: %w", redactURL(c.redisURL), err)
	}
	return rdb, nil
}
