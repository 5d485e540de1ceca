package main

import (
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

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
