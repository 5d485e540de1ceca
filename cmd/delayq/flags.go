package main

import (
	"log/slog"
	"net/http"

	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/sidecar"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"io"
	"net"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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
	cfg, err := parsePostgresURL(c.databaseURL)
	if err != nil {
		return nil, err
	}
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

// openRedis connects and pings, with errors in one line and no password.
func (c *connFlags) openRedis(ctx context.Context) (redis.UniversalClient, error) {
	if c.redisURL == "" {
		return nil, usagef("no Redis URL: set REDIS_URL or --redis-url")
	}
	newClient, _, _, err := parseRedisURL(c.redisURL)
	if err != nil {
		return nil, err
	}
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

// sidecarDeps is what the long-running commands (relay, worker) connect to: both
// servers, a delayq client and a Prometheus registry with the process collectors.
type sidecarDeps struct {
	pool *pgxpool.Pool
	rdb  redis.UniversalClient
	dq   *dispatch.Client
	reg  *prometheus.Registry
}

func (c *connFlags) openSidecar(ctx context.Context, logger *slog.Logger) (*sidecarDeps, error) {
	pool, err := c.openPostgres(ctx)
	if err != nil {
		return nil, err
	}
	rdb, err := c.openRedis(ctx)
	if err != nil {
		pool.Close()
		return nil, err
	}
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: c.prefix, Logger: logger})
	if err != nil {
		pool.Close()
		_ = rdb.Close()
		return nil, usagef("%v", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &sidecarDeps{pool: pool, rdb: rdb, dq: dq, reg: reg}, nil
}

// startAdmin serves /metrics, /healthz and /readyz (both servers checked, and the
// extra checks) on listen; an empty listen serves nothing and returns nil.
func (s *sidecarDeps) startAdmin(listen string, logger *slog.Logger, extra ...sidecar.Check) (*sidecar.Server, error) {
	return s.startAdminUI(listen, logger, nil, extra...)
}

// startAdminUI is startAdmin that also serves the dashboard ui (nil: none) under
// sidecar.UIPath.
func (s *sidecarDeps) startAdminUI(listen string, logger *slog.Logger, ui http.Handler, extra ...sidecar.Check) (*sidecar.Server, error) {
	if listen == "" {
		return nil, nil
	}
	return sidecar.Start(sidecar.Config{
		Addr:     listen,
		Gatherer: s.reg,
		Checks:   append([]sidecar.Check{sidecar.PostgresCheck(s.pool), sidecar.RedisCheck(s.rdb)}, extra...),
		Logger:   logger,
		UI:       ui,
	})
}

func (s *sidecarDeps) close() {
	s.pool.Close()
	_ = s.rdb.Close()
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

// redactURL returns u with any password replaced, safe for logs and errors: the
// user information's password and query parameters such as password= and
// sslpassword= (pgx reads them). A string that does not parse as a URL is not
// echoed at all.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Scheme == "" || p.Opaque != "" {
		return "(unparseable URL)"
	}
	if _, rest, ok := strings.Cut(u, "://"); ok {
		// An '@' after the host: a password holding an unescaped '/', '?' or '#'
		// would end the host early and land in the path, query or fragment.
		if end := strings.IndexAny(rest, "/?#"); end >= 0 && strings.Contains(rest[end:], "@") {
			return p.Scheme + "://(not shown: '@' after the host)"
		}
	}
	if p.RawQuery != "" {
		q, err := url.ParseQuery(p.RawQuery)
		masked := false
		for k := range q {
			if strings.Contains(strings.ToLower(k), "password") {
				q[k] = []string{"xxxxx"}
				masked = true
			}
		}
		if masked || err != nil { // malformed pairs are dropped, not shown
			p.RawQuery = q.Encode()
		}
	}
	p.Fragment, p.RawFragment = "", ""
	return p.Redacted()
}

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

// parsePostgresURL parses a PostgreSQL URL or keyword/value string; its error is
// a usage error that shows no password.
func parsePostgresURL(s string) (*pgxpool.Config, error) {
	// A URL of another database (mysql://…) is named as such, rather than by
	// pgx's keyword/value parser, which it falls through to.
	if scheme, _, ok := strings.Cut(s, "://"); ok && scheme != "postgres" && scheme != "postgresql" {
		return nil, usagef("PostgreSQL URL %s: scheme %q, want postgres:// or postgresql://", redactURL(s), scheme)
	}
	cfg, err := pgxpool.ParseConfig(s)
	if err != nil {
		return nil, usagef("malformed PostgreSQL URL %s: %s", redactURL(s), parseError(err, s))
	}
	return cfg, nil
}

// parseRedisURL parses a Redis URL; its error is a usage error that shows no
// password.
//
// A URL naming more nodes with addr parameters is a Redis Cluster
// (redis://user:pass@host1:6379?addr=host2:6379&addr=host3:6379). Its client
// re-reads the cluster layout every second: go-redis's default of a minute
// would leave it talking to a crashed master that long after a failover.
// network and addr name a node to dial first, for a plain reachability check.
func parseRedisURL(s string) (newClient func() redis.UniversalClient, network, addr string, err error) {
	if u, perr := url.Parse(s); perr == nil && u.Query().Has("addr") {
		opt, err := redis.ParseClusterURL(s)
		if err != nil {
			return nil, "", "", usagef("malformed Redis Cluster URL %s: %s", redactURL(s), parseError(err, s))
		}
		if opt.ClusterStateReloadInterval == 0 {
			opt.ClusterStateReloadInterval = time.Second
		}
		return func() redis.UniversalClient { return redis.NewClusterClient(opt) }, "tcp", opt.Addrs[0], nil
	}
	opt, err := redis.ParseURL(s)
	if err != nil {
		return nil, "", "", usagef("malformed Redis URL %s: %s", redactURL(s), parseError(err, s))
	}
	return func() redis.UniversalClient { return redis.NewClient(opt) }, opt.Network, opt.Addr, nil
}

// parseError is a parser's message about connString with whatever may be a
// password in connString masked. The messages quote the part that failed, which
// can be the password: an unescaped '/' in it ends the host early (`invalid port
// ":secret"`), net/url quotes the whole URL, and pgx's own redaction of a
// malformed string is best effort ("password = secret" passes it).
func parseError(err error, connString string) string {
	msg := err.Error()
	for _, s := range secretsIn(connString) {
		msg = strings.ReplaceAll(msg, s, "xxxxx")
	}
	return msg
}

// kvPassword finds the values of password= and sslpassword= in keyword/value and
// query form, with the spaces around '=' that libpq allows.
var kvPassword = regexp.MustCompile(`(?i)password\s*=\s*('(?:[^'\\]|\\.)*'?|\S*)`)

// secretsIn lists the strings of connString that may be a password or a piece of
// one, longest first, raw, unescaped and as %q would print them: the user
// information after its first ':' (up to the last '@') and its pieces between
// '/', '?', '#', ':' and '@'; every value of a key ending in "password". Pieces
// shorter than 3 bytes are left alone.
func secretsIn(connString string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(v string) {
		if len(v) < 3 || seen[v] {
			return
		}
		seen[v] = true
		q := strconv.Quote(v)
		out = append(out, v, q[1:len(q)-1])
		if d, err := url.PathUnescape(v); err == nil && d != v {
			out = append(out, d)
		}
	}
	if _, rest, ok := strings.Cut(connString, "://"); ok {
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
				add(pw)
				for _, piece := range strings.FieldsFunc(pw, func(r rune) bool { return strings.ContainsRune("/?#:@", r) }) {
					add(piece)
				}
			}
		}
	}
	for _, m := range kvPassword.FindAllStringSubmatch(connString, -1) {
		v := m[1]
		add(v)
		add(strings.Trim(v, "'"))
		if i := strings.IndexAny(v, "&#"); i >= 0 {
			add(v[:i])
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}
