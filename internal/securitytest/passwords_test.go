package securitytest

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

// commandsWithURLs are the commands that take DATABASE_URL and REDIS_URL, with the
// arguments they need to get as far as connecting.
var commandsWithURLs = [][]string{
	{"relay", "--listen", ""},
	{"worker", "--queue", "mail", "--exec", "true", "--listen", ""},
	{"reconcile"},
	{"reconcile", "--dry-run"},
	{"check"},
	{"stats"},
	{"dead", "list"},
	{"dead", "retry", "--queue", "mail", "x"},
	{"dead", "purge", "--yes", "--queue", "mail"},
	{"enqueue", "--queue", "mail", "--id", "x", "--payload", "p"},
	{"cancel", "--queue", "mail", "--id", "x"},
	{"reschedule", "--queue", "mail", "--id", "x", "--delay", "1m"},
	{"migrate", "status"},
	{"migrate", "up"},
}

// TestPasswordsNeverPrinted runs every command that connects with URLs carrying a
// password, against servers that cannot be reached, that refuse the password,
// that speak TLS when the client does not (or the other way round), and with
// malformed URLs, plus --help with the URLs in the environment: whatever the exit
// code, neither standard output nor standard error shows the password.
func TestPasswordsNeverPrinted(t *testing.T) {
	t.Parallel()
	e := startTLSEnv(t)
	const pw = "Pw-never-shown-93kq"
	plainRedis := testenv.OwnRedis(t, "--requirepass", "right-redis-password")

	wrongPG, _ := url.Parse(e.dbURL)
	wrongPG.User = url.UserPassword("postgres", pw)
	plainPG, _ := url.Parse(e.dbURL)
	plainPG.User = url.UserPassword("postgres", pw)
	q := plainPG.Query()
	q.Set("sslmode", "disable")
	plainPG.RawQuery = q.Encode()
	goodPG := e.dbURL
	ca := e.redis.TLS().CAFile

	cases := []struct {
		name     string
		env      map[string]string
		codes    string // allowed exit codes
		commands [][]string
	}{
		{"unreachable servers", map[string]string{
			"DATABASE_URL": "postgres://app:" + pw + "@127.0.0.1:1/app?connect_timeout=5",
			"REDIS_URL":    "redis://app:" + pw + "@127.0.0.1:1/0"}, "1", commandsWithURLs},
		{"PostgreSQL refuses the password", map[string]string{
			"DATABASE_URL": wrongPG.String(), "REDIS_URL": "redis://app:" + pw + "@127.0.0.1:1/0"}, "1", commandsWithURLs},
		{"PostgreSQL without TLS on a hostssl-only server", map[string]string{
			"DATABASE_URL": plainPG.String(), "REDIS_URL": "redis://app:" + pw + "@127.0.0.1:1/0"}, "1", commandsWithURLs},
		{"Redis refuses the password", map[string]string{
			"DATABASE_URL": goodPG, "SSL_CERT_FILE": ca,
			"REDIS_URL": "redis://default:" + pw + "@" + plainRedis.Addr() + "/0"}, "01", commandsWithURLs},
		{"Redis ACL user with a wrong password over TLS", map[string]string{
			"DATABASE_URL": goodPG, "SSL_CERT_FILE": ca,
			"REDIS_URL": "rediss://delayq-relay:" + pw + "@" + e.redis.Addr() + "/0"}, "01", commandsWithURLs},
		{"rediss:// without the CA", map[string]string{
			"DATABASE_URL": goodPG,
			"REDIS_URL":    "rediss://delayq-relay:" + pw + "@" + e.redis.Addr() + "/0"}, "01", commandsWithURLs},
		{"redis:// on the TLS port", map[string]string{
			"DATABASE_URL": goodPG,
			"REDIS_URL":    "redis://delayq-relay:" + pw + "@" + e.redis.Addr() + "/0?dial_timeout=2s&read_timeout=2s"}, "01", commandsWithURLs},
		{"malformed PostgreSQL URL", map[string]string{
			"DATABASE_URL": "postgres://app:" + pw + "@db.invalid:notaport/app",
			"REDIS_URL":    "redis://app:" + pw + "@127.0.0.1:1/0"}, "2", commandsWithURLs},
		{"PostgreSQL keyword/value with spaces", map[string]string{
			"DATABASE_URL": "host=db.invalid password = " + pw + " port=x",
			"REDIS_URL":    "redis://app:" + pw + "@127.0.0.1:1/0"}, "2", commandsWithURLs},
		{"PostgreSQL password in the query", map[string]string{
			"DATABASE_URL": "postgres://app@127.0.0.1:1/app?password=" + pw,
			"REDIS_URL":    "redis://app:" + pw + "@127.0.0.1:1/0"}, "1", commandsWithURLs},
		{"a '/' in the password", map[string]string{
			"DATABASE_URL": "postgres://app:" + pw + "/x@127.0.0.1:1/app",
			"REDIS_URL":    "redis://app:" + pw + "/x@127.0.0.1:1/0"}, "12", commandsWithURLs},
		{"--help", map[string]string{
			"DATABASE_URL": "postgres://app:" + pw + "@127.0.0.1:1/app",
			"REDIS_URL":    "redis://app:" + pw + "@127.0.0.1:1/0"}, "0", helpOf(commandsWithURLs)},
		{"demo and bench with malformed URLs", map[string]string{
			"DATABASE_URL": "postgres://app:" + pw + "@h:notaport/app",
			"REDIS_URL":    "redis://app:" + pw + "/x@h:1/0"}, "2", [][]string{{"demo"}, {"bench", "--scale", "0.01"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, args := range tc.commands {
				r := runBin(t, tc.env, "", args...)
				if !strings.Contains(tc.codes, fmt.Sprint(r.code)) {
					t.Errorf("%v: exit %d, want one of %s\n%s", args, r.code, tc.codes, r.out())
				}
				noSecret(t, fmt.Sprint(args), r.out(), pw)
			}
		})
	}
}

func helpOf(cmds [][]string) [][]string {
	seen := map[string]bool{}
	var out [][]string
	for _, c := range cmds {
		if !seen[c[0]] {
			seen[c[0]] = true
			out = append(out, []string{c[0], "--help"})
		}
	}
	return out
}

// TestLogsWithoutPasswordsWhenRedisGoesAway runs the relay and a worker at debug
// level with passwords in both URLs, kills Redis under them and starts it again:
// they log the outage and the recovery, keep working, stop with exit 0, and no
// line of their logs shows a password.
func TestLogsWithoutPasswordsWhenRedisGoesAway(t *testing.T) {
	t.Parallel()
	e := startTLSEnv(t)
	const redisPW = "redis-pw-goes-away-4j"
	r := testenv.OwnRedis(t, "--requirepass", redisPW)
	env := map[string]string{
		"DATABASE_URL": e.dbURL,
		"REDIS_URL":    "redis://default:" + redisPW + "@" + r.Addr() + "/0",
	}
	if res := runBin(t, env, "", "migrate", "up"); res.code != 0 {
		t.Fatalf("migrate: %s", res.out())
	}
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			rl := startBin(t, env, "relay", "--listen", "", "--poll-interval", "100ms", "--reap-interval", "100ms",
				"--log-level", "debug", "--log-format", format)
			wk := startBin(t, env, "worker", "--queue", "q"+format, "--exec", "true", "--listen", "",
				"--log-level", "debug", "--log-format", format)
			rl.waitLog(t, time.Minute, `relay: started`)
			wk.waitLog(t, time.Minute, `worker: st`)

			r.Kill()
			pool := e.pool(t)
			ob, _ := outbox.New(outbox.Config{})
			if _, err := ob.Enqueue(context.Background(), pool, outbox.Task{Queue: "q" + format, ID: "during-outage"}); err != nil {
				t.Fatal(err)
			}
			rl.waitLog(t, 30*time.Second, `Redis unreachable`)
			if err := r.Start(ctxT(t, time.Minute)); err != nil {
				t.Fatal(err)
			}
			rl.waitLog(t, 60*time.Second, `Redis reachable again`)
			waitFor(t, 60*time.Second, "the task run after the outage", func() bool {
				var st string
				_ = pool.QueryRow(context.Background(), `SELECT state FROM delayq_outbox WHERE queue = $1 AND task_id = 'during-outage'`, "q"+format).Scan(&st)
				return st == "done"
			})
			if code := wk.stop(t); code != 0 {
				t.Errorf("worker exit %d", code)
			}
			if code := rl.stop(t); code != 0 {
				t.Errorf("relay exit %d", code)
			}
			noSecret(t, "relay log", rl.out(), redisPW, tlsPGPassword)
			noSecret(t, "worker log", wk.out(), redisPW, tlsPGPassword)
			if !strings.Contains(rl.out(), "xxxxx") {
				t.Errorf("the relay's start line shows no redacted URL:\n%s", rl.out())
			}
		})
	}
}
