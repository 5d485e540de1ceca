package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/internal/validate"
)

// TestSeveralDatabasesCommands: stats and check with --database KEY=URL
// (repeated) report each database under its key, and the total.
func TestSeveralDatabasesCommands(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	usURL := testenv.PostgresURL(t)
	us := testenv.Pool(t, usURL)
	// eu1: three queued rows that Redis lost; us1: two pending rows of pay, one
	// of mail, and its pay orphan in Redis under PREFIX:us1.
	b.exec(t, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, attempt)
SELECT 'pay', 'o-' || i, now() - interval '1 minute', 'p', 5, 'queued', 1 FROM generate_series(1, 3) AS i`)
	if _, err := us.Exec(context.Background(), `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state)
VALUES ('pay', 'p-1', now() + interval '1 hour', 'p', 5, 'pending'), ('pay', 'p-2', now() + interval '1 hour', 'p', 5, 'pending'),
	('mail', 'm-1', now() + interval '1 hour', 'p', 5, 'pending')`); err != nil {
		t.Fatal(err)
	}
	usDQ, err := dispatch.New(b.rdb, dispatch.Config{Prefix: b.prefix + ":us1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := usDQ.Enqueue(context.Background(), "pay", dispatch.Task{ID: "orphan-us1"}); err != nil {
		t.Fatal(err)
	}
	args := func(cmd string, more ...string) []string {
		return append([]string{cmd, "--prefix", b.prefix, "--database", "eu1=" + b.env["DATABASE_URL"], "--database", "us1=" + usURL}, more...)
	}

	r := b.run(t, args("stats")...)
	r.want(t, exitOK, "DATABASE", "eu1", "us1", "TOTAL")
	rows := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n")[1:] {
		f := strings.Fields(l)
		rows[f[0]+"/"+f[1]] = strings.Join(f[2:4], " ") // PENDING QUEUED
	}
	for k, v := range map[string]string{"eu1/pay": "0 3", "us1/pay": "2 0", "us1/mail": "1 0", "TOTAL/pay": "2 3", "TOTAL/mail": "1 0"} {
		if rows[k] != v {
			t.Errorf("stats row %s: pending, queued %q, want %q\n%s", k, rows[k], v, r.stdout)
		}
	}
	if len(rows) != 5 {
		t.Errorf("stats: %d rows, want 5\n%s", len(rows), r.stdout)
	}
	r = b.run(t, args("stats", "--json")...)
	r.want(t, exitOK)
	var st struct {
		Databases []struct {
			Database string                 `json:"database"`
			Queues   []reconcile.QueueStats `json:"queues"`
		} `json:"databases"`
		Total []reconcile.QueueStats `json:"total"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, r.stdout)
	}
	if len(st.Databases) != 2 || st.Databases[0].Database != "eu1" || st.Databases[1].Database != "us1" || len(st.Total) != 2 {
		t.Fatalf("stats --json: %s", r.stdout)
	}
	// The total's queues in order: mail, pay. Redis: eu1 lost its three; us1's
	// orphan is ready.
	if p := st.Total[1]; p.Queue != "pay" || p.Postgres["pending"] != 2 || p.Postgres["queued"] != 3 || p.Ready != 1 {
		t.Errorf("total of pay: %+v", p)
	}

	r = b.run(t, args("check")...)
	r.want(t, exitFailure, "DATABASE", "missing_in_redis", "o-2", "unknown_in_postgres", "orphan-us1")
	r.oneLineErr(t, "4 inconsistencies found (eu1 3, us1 1;")
	r = b.run(t, args("check", "--json")...)
	r.want(t, exitFailure)
	var incs []databaseInconsistency
	if err := json.Unmarshal([]byte(r.stdout), &incs); err != nil || len(incs) != 4 {
		t.Fatalf("check --json: %v %s", err, r.stdout)
	}
	for _, inc := range incs {
		if (inc.Database == "us1") != (inc.ID == "orphan-us1") {
			t.Errorf("inconsistency %+v under the wrong database", inc)
		}
	}
	// The orphan is us1's alone: found when us1 is checked by itself.
	b.run(t, "check", "--prefix", b.prefix, "--database", "us1="+usURL).want(t, exitFailure, "orphan-us1")

	// A clash with the one-database flags, and a bad value: usage errors, in one
	// line, without the password.
	r = b.run(t, args("stats", "--database-key", "eu1")...)
	r.want(t, exitUsage)
	r.oneLineErr(t, "drop --database-key")
	r = b.run(t, "stats", "--database", "EU=postgres://u:s3cret@h/db")
	r.want(t, exitUsage)
	r.oneLineErr(t, "bad --database: value 1: key")
	if strings.Contains(r.stderr, "s3cret") {
		t.Errorf("the password in %q", r.stderr)
	}
}

func TestParseDatabases(t *testing.T) {
	t.Parallel()
	good, err := parseDatabases([]string{"eu1=postgres://h1/app", "us-1=postgresql://u:p@h2/app?sslmode=disable"})
	if err != nil || len(good) != 2 || good[0] != (namedDatabase{"eu1", "postgres://h1/app"}) || good[1].key != "us-1" {
		t.Fatalf("parseDatabases: %+v, %v", good, err)
	}
	for _, c := range []struct {
		specs []string
		want  string
	}{
		{[]string{"eu1"}, "value 1: want KEY=URL"},
		{[]string{"eu1="}, "value 1: want KEY=URL"},
		{[]string{"=postgres://h/db"}, "value 1: key"},
		{[]string{"eu1=postgres://h/db", "Eu_1=postgres://h/db"}, "value 2: key"},
		{[]string{"eu1=postgres://h/db", "eu1=postgres://h2/db"}, `key "eu1" given twice`},
		{[]string{"eu1=mysql://u:s3cret@h/db"}, `eu1: PostgreSQL URL`},
		{make([]string, maxDatabases+1), "at most 64"},
	} {
		_, err := parseDatabases(c.specs)
		if !errors.Is(err, errDatabaseFlag) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseDatabases(%q): %v, want errDatabaseFlag and %q", c.specs, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("parseDatabases(%q): the password in %v", c.specs, err)
		}
	}
}

// FuzzParseDatabases: any value is accepted with a valid, single key and a URL
// that parses, or rejected with errDatabaseFlag; never a panic, never the
// password in the message.
func FuzzParseDatabases(f *testing.F) {
	for _, s := range []string{"eu1=postgres://h/db", "eu1", "=", "a=b=c", "x=postgres://u:s3cret@h:1/db?sslmode=require", "é=postgres://h/db"} {
		f.Add(s, "us1=postgres://h2/db")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		dbs, err := parseDatabases([]string{a, b})
		if err != nil {
			if !errors.Is(err, errDatabaseFlag) {
				t.Fatalf("%v: not errDatabaseFlag", err)
			}
			// A password in a URL (after KEY=) is never shown.
			_, ua, _ := strings.Cut(a, "=")
			_, ub, _ := strings.Cut(b, "=")
			if strings.Contains(ua+ub, "s3cret") && !strings.Contains(a[:len(a)-len(ua)]+b[:len(b)-len(ub)], "s3cret") &&
				strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("the password in %v", err)
			}
			return
		}
		if len(dbs) != 2 || dbs[0].key == dbs[1].key {
			t.Fatalf("%+v", dbs)
		}
		for _, d := range dbs {
			if validate.Database(d.key) != nil {
				t.Fatalf("key %q accepted", d.key)
			}
			if _, err := parsePostgresURL(d.url); err != nil {
				t.Fatalf("URL of %q accepted: %v", d.key, err)
			}
		}
	})
}
