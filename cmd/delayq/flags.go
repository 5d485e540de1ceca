package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// errHelp is returned when --help was asked for: usage printed, exit 0.
var errHelp = errors.New("help requested")

// flagSet is a subcommand's flags with its help text.
type flagSet struct {
	*flag.FlagSet
	help func()
}

// newFlagSet makes a flag set whose --help prints the synopsis, the examples and
// the flags with their defaults.
func newFlagSet(m *Main, name, synopsis, examples string) *flagSet {
	fs := flag.NewFlagSet("delayq "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported once, by Run
	fs.Usage = func() {}     // the flag package calls it on every error; help is printed by parse
	help := func() {
		out := m.Stdout
		fmt.Fprintf(out, "Usage: delayq %s\n\n", synopsis)
		if examples != "" {
			fmt.Fprintf(out, "Examples:\n%s\n", examples)
		}
		fmt.Fprintln(out, "Flags:")
		fs.SetOutput(out)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		fmt.Fprintln(out, "\nEnvironment: DATABASE_URL, REDIS_URL (flags override them).")
		fmt.Fprintln(out, "Exit codes: 0 ok, 1 failure, 2 usage error.")
	}
	return &flagSet{FlagSet: fs, help: help}
}

// parse parses args, turning flag errors into usage errors and --help into errHelp.
func parse(fs *flagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.help()
			return errHelp
		}
		return usagef("%v (see --help)", err)
	}
	return nil
}

// connFlags are the connection flags most subcommands share.
type connFlags struct {
	databaseURL string
	redisURL    string
	schema      string
	prefix      string
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
	}
}

// openPostgres connects and pings, with errors in one line and no password.
func (c *connFlags) openPostgres(ctx context.Context) (*pgxpool.Pool, error) {
	if c.databaseURL == "" {
		return nil, usagef("no PostgreSQL URL: set DATABASE_URL or --database-url")
	}
	cfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		// pgx keeps passwords out of ParseConfigError; say which URL by its safe form.
		return nil, usagef("malformed PostgreSQL URL %s: %v", redactURL(c.databaseURL), err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL %s: %w", redactURL(c.databaseURL), err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL %s unreachable: %w", redactURL(c.databaseURL), err)
	}
	return pool, nil
}

// openRedis connects and pings, with errors in one line and no password.
func (c *connFlags) openRedis(ctx context.Context) (redis.UniversalClient, error) {
	if c.redisURL == "" {
		return nil, usagef("no Redis URL: set REDIS_URL or --redis-url")
	}
	opt, err := redis.ParseURL(c.redisURL)
	if err != nil {
		return nil, usagef("malformed Redis URL %s: %s", redactURL(c.redisURL), strings.ReplaceAll(err.Error(), c.redisURL, redactURL(c.redisURL)))
	}
	rdb := redis.NewClient(opt)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("Redis %s unreachable: %w", redactURL(c.redisURL), err)
	}
	return rdb, nil
}

// urlFlag is a URL flag whose value, when shown (as the default from the
// environment in --help), has its password redacted.
type urlFlag struct{ v *string }

func (f urlFlag) String() string {
	if f.v == nil || *f.v == "" {
		return ""
	}
	return redactURL(*f.v)
}

func (f urlFlag) Set(s string) error {
	*f.v = s
	return nil
}

// redactURL returns u with any password replaced, safe for logs and errors. A
// string that does not parse as a URL is not echoed at all.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Scheme == "" {
		return "(unparseable URL)"
	}
	return p.Redacted()
}
