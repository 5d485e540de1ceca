package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
)

// testErrorLines is the table of the errors a user of the command meets, each
// with its exit code and the one line it writes on stderr, matched whole: what
// is wrong, the value, and the fix where there is one; never a password.
// (The library's table is delayq's TestUserErrorLines.)
func testErrorLines(t *testing.T, runBin func(*testing.T, map[string]string, ...string) cliResult) {
	migrated := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "REDIS_URL": testenv.RedisURL(t)}
	empty := map[string]string{"DATABASE_URL": testenv.EmptyPostgresURL(t), "REDIS_URL": testenv.RedisURL(t)}
	deadRedis := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "REDIS_URL": "redis://:secret@127.0.0.1:1"}
	big := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(big, make([]byte, 70000), 0o600); err != nil {
		t.Fatal(err)
	}
	soon := time.Now().Add(2 * time.Second).UTC().Format(time.RFC3339)
	const hint = ` not found \(run the migrations: delayq migrate up\)`
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		line string // a regular expression of the whole line, without its newline
	}{
		{"missing table: enqueue", empty, []string{"enqueue", "--queue", "q", "--id", "x"}, exitFailure,
			`delayq enqueue: outbox: enqueue q/x: table "public\.delayq_outbox"` + hint},
		{"missing table: stats", empty, []string{"stats"}, exitFailure,
			`delayq stats: reconcile: list queues: table "public\.delayq_outbox"` + hint},
		{"missing table: dead list", empty, []string{"dead", "list"}, exitFailure,
			`delayq dead list: reconcile: list dead: table "public\.delayq_outbox"` + hint},
		{"missing table: queue pause", empty, []string{"queue", "pause", "q"}, exitFailure,
			`delayq queue pause: queue controls: pause: set paused q: table "public\.delayq_queues"` + hint},
		{"missing table: schedules pause", empty, []string{"schedules", "pause", "x"}, exitFailure,
			`delayq schedules pause: schedule x: table "public\.delayq_schedules"` + hint},
		{"unknown schedule", migrated, []string{"schedules", "run", "nope"}, exitFailure,
			`delayq schedules run: schedule "nope": no such schedule on this database \('delayq schedules' lists them; --file for one of a file no relay ran yet\)`},
		{"start deadline before the due time", migrated, []string{"enqueue", "--queue", "q", "--id", "late", "--delay", "4s", "--start-by", soon}, exitUsage,
			`delayq enqueue: --start-by ` + regexp.QuoteMeta(soon) + ` is before the task's due time \S+Z \(its run-at, or now plus its delay on the database clock\): it could never start; nothing enqueued`},
		{"bad queue name", migrated, []string{"enqueue", "--queue", "a{b", "--id", "x"}, exitUsage,
			`delayq enqueue: --queue: invalid queue name: "a\{b" has '\{' at byte 1; allowed are letters, digits, '_', '\.', '-'`},
		{"bad task id", migrated, []string{"enqueue", "--queue", "q", "--id", "a b"}, exitUsage,
			`delayq enqueue: --id: invalid task id: "a b" has a space at byte 1; allowed is printable ASCII except space, '\{' and '\}'`},
		{"payload too large", migrated, []string{"enqueue", "--queue", "q", "--id", "big", "--payload-file", big}, exitUsage,
			`delayq enqueue: payload too large: 70000 bytes, at most 65536 \(Config\.MaxPayloadBytes\)`},
		{"unknown command", migrated, []string{"enqeue"}, exitUsage,
			`delayq: unknown command "enqeue" \(run 'delayq help' for the list\)`},
		{"unknown flag", migrated, []string{"stats", "--queues", "a"}, exitUsage,
			`delayq stats: unknown flag --queues \(see --help\)`},
		{"flag without its value", migrated, []string{"dead", "list", "--limit"}, exitUsage,
			`delayq dead list: flag --limit needs a value \(see --help\)`},
		{"not a duration", migrated, []string{"enqueue", "--queue", "q", "--id", "x", "--delay", "5"}, exitUsage,
			`delayq enqueue: --delay "5": want a duration such as 90s, 5m or 1h30m \(see --help\)`},
		{"Redis unreachable", deadRedis, []string{"stats"}, exitFailure,
			`delayq stats: Redis redis://:xxxxx@127\.0\.0\.1:1 unreachable: dial tcp 127\.0\.0\.1:1: connect: connection refused`},
	} {
		r := runBin(t, c.env, c.args...)
		if r.code != c.code || !regexp.MustCompile(`^`+c.line+`\n$`).MatchString(r.stderr) || strings.Contains(r.stderr, "secret") {
			t.Errorf("%s: exit %d, stderr %q\nwant exit %d, the line %s", c.name, r.code, r.stderr, c.code, c.line)
		}
	}
	// dev starts its own servers: its help names no environment.
	if r := runBin(t, nil, "dev", "--help"); r.code != exitOK || strings.Contains(r.stdout, "Environment:") || strings.Contains(r.stdout, "DATABASE_URL") {
		t.Errorf("dev --help: exit %d\n%s", r.code, r.stdout)
	}
}
