package main

import (
	"bytes"
	"context"
	"net/url"
	"strings"
	"testing"
	"time"
)

// fuzzPassword is the password every fuzzed URL carries. No output may show it.
const fuzzPassword = "Fz9pwSECRETx7"

// fuzzCommands are the commands whose flags and configuration the fuzzer drives.
// demo and bench are left out: without URLs they start throwaway servers.
var fuzzCommands = []string{"relay", "worker", "reconcile", "check", "stats", "dead",
	"enqueue", "cancel", "reschedule", "migrate"}

// fuzzDatabaseURL builds a PostgreSQL connection string with the password in it,
// in one of the forms pgx accepts, around the fuzzer's tail.
func fuzzDatabaseURL(form uint8, tail string) string {
	switch form % 4 {
	case 0:
		return "postgres://app:" + fuzzPassword + "@" + tail
	case 1:
		return "postgresql://app:" + fuzzPassword + "@" + tail
	case 2:
		return "password=" + fuzzPassword + " " + tail
	default:
		return "postgres://" + tail + querySep(tail) + "password=" + fuzzPassword
	}
}

// querySep is what joins one more query parameter to u.
func querySep(u string) string {
	if strings.Contains(u, "?") {
		return "&"
	}
	return "?"
}

func fuzzRedisURL(form uint8, tail string) string {
	switch form % 3 {
	case 0:
		return "redis://app:" + fuzzPassword + "@" + tail
	case 1:
		return "rediss://:" + fuzzPassword + "@" + tail
	default:
		return "unix://app:" + fuzzPassword + "@" + tail
	}
}

// FuzzCommandArgs runs a command with fuzzed flags and fuzzed URLs that carry a
// password, with its context already cancelled so it never gets to talk to a
// server (the hosts are unreachable ones as well). Whatever the input: no panic,
// exit code 0, 1 or 2, at most a help text or one line on standard error, and the
// password never printed.
func FuzzCommandArgs(f *testing.F) {
	seeds := []struct {
		cmd       uint8
		args      string
		form      uint8
		dbTail    string
		redisTail string
	}{
		{0, "", 0, "127.0.0.1:1/app", "127.0.0.1:1/0"},
		{0, "--horizon\n10m\n--batch\n0", 1, "127.0.0.1:1/app?sslmode=verify-full", "127.0.0.1:1"},
		{0, "--listen\n:9090\n--log-format\njson\n--queues\na,b{c}", 2, "host=127.0.0.1 port=1 dbname=app", "127.0.0.1:notaport"},
		{1, "--queue\nmail\n--exec\ntrue\n--lease\n1ms", 0, "[oops", "127.0.0.1:1/99"},
		{1, "--queue\n{x}\n--exec\n", 3, "127.0.0.1:1/app", "[::1"},
		{2, "--dry-run\n--batch\n-1", 0, "h:1/d?sslmode=bogus", "h:1/0?dial_timeout=x"},
		{3, "--prefix\nbad prefix", 1, "h:99999/d", "h:1"},
		{4, "--json", 0, "127.0.0.1:1/app", "127.0.0.1:1"},
		{5, "list\n--queue\npay", 0, "127.0.0.1:1/app", "127.0.0.1:1"},
		{5, "retry\n--queue\npay\n--id\nx", 2, "host=h password='a b' port=1", "127.0.0.1:1"},
		{6, "--queue\npay\n--id\no-1\n--delay\n-5s\n--payload\n{}", 0, "127.0.0.1:1/app", ""},
		{6, "--queue\npay\n--id\no-1\n--at\n2030-01-02T15:04:05Z\n--max-attempts\n-1", 3, "%zz", ""},
		{7, "--queue\npay\n--id\no-1", 0, "127.0.0.1:1/app", "127.0.0.1:1"},
		{8, "--queue\npay\n--id\no-1\n--delay\n1h", 0, "127.0.0.1:1/app", ""},
		{9, "up", 0, "127.0.0.1:1/app", ""},
		{9, "status\n--schema\nJobs", 2, "sslmode=require host=/tmp", ""},
		{0, "--help", 0, "", ""},
		{5, "--", 0, "@", "@"},
	}
	for _, s := range seeds {
		f.Add(s.cmd, s.args, s.form, s.dbTail, s.redisTail)
	}
	f.Fuzz(func(t *testing.T, cmd uint8, argLine string, form uint8, dbTail, redisTail string) {
		if strings.Contains(argLine+dbTail+redisTail, fuzzPassword) {
			return // the input itself shows the password
		}
		if strings.Contains(argLine, "payload-file") {
			return // reads a file or standard input: not a configuration question
		}
		name := fuzzCommands[int(cmd)%len(fuzzCommands)]
		args := []string{name}
		if argLine != "" {
			args = append(args, strings.Split(argLine, "\n")...)
		}
		env := map[string]string{
			"DATABASE_URL": fuzzDatabaseURL(form, dbTail),
			"REDIS_URL":    fuzzRedisURL(form>>2, redisTail),
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var stdout, stderr bytes.Buffer
		done := make(chan int, 1)
		go func() {
			done <- NewMain(&stdout, &stderr, func(k string) string { return env[k] }).Run(ctx, args)
		}()
		var code int
		select {
		case code = <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("%q did not return within 20s", args)
		}
		if code != exitOK && code != exitFailure && code != exitUsage {
			t.Fatalf("%q: exit code %d", args, code)
		}
		out := stdout.String() + stderr.String()
		if strings.Contains(out, fuzzPassword) {
			t.Fatalf("%q with DATABASE_URL %q REDIS_URL %q printed the password:\n%s",
				args, env["DATABASE_URL"], env["REDIS_URL"], out)
		}
		if code != exitOK && strings.Count(stderr.String(), "\n") > 1 {
			t.Fatalf("%q: exit %d with more than one line on standard error:\n%s", args, code, stderr.String())
		}
	})
}

// FuzzRedactURL: whatever surrounds it, a password in a URL's user information or
// in a password= query parameter never survives redactURL, raw or escaped.
func FuzzRedactURL(f *testing.F) {
	f.Add("postgres", "app", "secret", "db.example.com:5432/app?sslmode=verify-full")
	f.Add("redis", "", "pw", "127.0.0.1:6379/0")
	f.Add("rediss", "default", "p@ss:w/rd", "[::1]:6380")
	f.Add("unix", "u", "pw", "/run/redis.sock?db=1")
	f.Fuzz(func(t *testing.T, scheme, user, password, rest string) {
		others := scheme + user + rest
		others += strings.ToLower(others) + url.PathEscape(others) + url.QueryEscape(others)
		if len(password) < 4 || strings.Contains(others, password) {
			return // too short to tell from the rest, or given elsewhere in the URL
		}
		sep := querySep(rest)
		for _, u := range []string{
			scheme + "://" + user + ":" + password + "@" + rest,
			scheme + "://" + user + ":" + password + "@",
			scheme + "://" + user + "@" + rest + sep + "password=" + url.QueryEscape(password),
			scheme + "://" + rest + sep + "sslpassword=" + url.QueryEscape(password) + "&x=1",
		} {
			got := redactURL(u)
			if strings.Contains(got, password) || strings.Contains(got, url.QueryEscape(password)) ||
				strings.Contains(got, url.PathEscape(password)) {
				t.Fatalf("redactURL(%q) = %q shows the password", u, got)
			}
		}
	})
}

// FuzzURLErrors: the errors of opening a fuzzed PostgreSQL or Redis URL that
// carries the password (malformed, or well formed and the context cancelled so
// nothing connects) never show the password.
func FuzzURLErrors(f *testing.F) {
	f.Add(uint8(0), "127.0.0.1:1/app", "")
	f.Add(uint8(1), "[oops", ":x")
	f.Add(uint8(2), "host=h port=x", "/db")
	f.Add(uint8(4), "host=h port=x", "")
	f.Add(uint8(5), "/x@h:1/db", "")
	f.Add(uint8(6), "h:1/d?sslmode=bogus", "\x7f")
	f.Add(uint8(0), "127.0.0.1:1?addr=127.0.0.1:2&addr=x:notaport", "/x")
	f.Add(uint8(1), "h:1/0?addr=[oops", "")
	f.Fuzz(func(t *testing.T, form uint8, tail, pwTail string) {
		if strings.Contains(tail, fuzzPassword) || strings.Contains(pwTail, fuzzPassword) {
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var urls []string
		switch form % 7 {
		case 4:
			urls = []string{"password = " + fuzzPassword + pwTail + " " + tail}
		case 5:
			urls = []string{"postgres://app:" + fuzzPassword + pwTail + "@" + tail}
		case 6:
			urls = []string{"host=h password='" + fuzzPassword + pwTail + "' " + tail}
		default:
			urls = []string{fuzzDatabaseURL(form, tail)}
		}
		for _, u := range urls {
			c := connFlags{databaseURL: u}
			if pool, err := c.openPostgres(ctx); err == nil {
				pool.Close()
			} else if strings.Contains(err.Error(), fuzzPassword) {
				t.Fatalf("openPostgres(%q): %v", u, err)
			}
		}
		for _, u := range []string{
			fuzzRedisURL(form, tail),
			"redis://app:" + fuzzPassword + pwTail + "@" + tail,
			"rediss://" + tail + querySep(tail) + "password=" + fuzzPassword,
		} {
			c := connFlags{redisURL: u}
			if rdb, err := c.openRedis(ctx); err == nil {
				rdb.Close()
			} else if strings.Contains(err.Error(), fuzzPassword) {
				t.Fatalf("openRedis(%q): %v", u, err)
			}
			if err := (&connFlags{redisURL: u, prefix: "dq"}).checkRedis(); err != nil && strings.Contains(err.Error(), fuzzPassword) {
				t.Fatalf("checkRedis(%q): %v", u, err)
			}
		}
	})
}
