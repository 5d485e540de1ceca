package delayq_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtest"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/schedule"
)

// TestUserErrorLines is the table of the errors a library user meets, each
// with the one line it gives: what is wrong, the value, and the fix where
// there is one. (The command's own table is TestBinary's "the line of each
// error".)
func TestUserErrorLines(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The package's test servers (testenv.Main stops them), not delayqtest's own,
	// which only delayqtest.Main would stop.
	env := delayqtest.New(t, delayqtest.Options{PostgresURL: testenv.PostgresURL(t), RedisURL: testenv.RedisURL(t)})
	c := env.Client(t, delayq.Config{Outbox: outbox.Config{MaxPayloadBytes: 1024}})
	ob := c.Outbox()
	type payload struct {
		N int `json:"n"`
	}
	typed := outbox.Queue[payload]{Name: "typed"}
	if err := delayq.Register(c, typed, func(context.Context, *delayq.Task, payload) error { return nil }, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	enqueue := func(task outbox.Task) error {
		_, err := ob.Enqueue(ctx, env.Pool, task)
		return err
	}
	// A producer of another service misspells a field: the typed handler's
	// strict decoding refuses it, and the task is dead with the reason.
	if err := enqueue(outbox.Task{Queue: "typed", ID: "misspelt", Payload: []byte(`{"m":1}`)}); err != nil {
		t.Fatal(err)
	}
	env.Work(ctx, t, c, "typed", "misspelt")
	dead, err := c.DeadTasks(ctx, 1, "typed")
	if err != nil || len(dead) != 1 {
		t.Fatalf("dead tasks: %v, %v", dead, err)
	}
	_, cronErr := schedule.Parse([]byte("schedules:\n  - name: nightly\n    queue: ops\n    cron: \"0 25 * * *\"\n"))
	unmigrated, err := delayq.New(testenv.Pool(t, testenv.EmptyPostgresURL(t)), env.Redis, delayq.Config{Prefix: env.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	_, statsErr := unmigrated.Stats(ctx)
	line := func(err error) string {
		if err == nil {
			return "<nil>"
		}
		return err.Error()
	}
	for _, c := range []struct {
		name, got, want string // want: a regular expression of the whole line
	}{
		{"unknown payload field (dead reason)", dead[0].LastError,
			`^invalid payload: queue typed: decode delayq_test\.payload: json: unknown field "m" \(a field the type lacks; JSONCodec\{AllowUnknownFields: true\} ignores such fields\)$`},
		{"invalid cron", line(cronErr), `^schedule: invalid: schedule nightly: cron "0 25 \* \* \*": end of range \(25\) above maximum \(23\): 25$`},
		{"bad queue name", line(enqueue(outbox.Task{Queue: "a{b", ID: "x"})),
			`^outbox: enqueue: invalid queue name: "a\{b" has '\{' at byte 1; allowed are letters, digits, '_', '\.', '-'$`},
		{"bad task id", line(enqueue(outbox.Task{Queue: "q", ID: "a b"})),
			`^outbox: enqueue: invalid task id: "a b" has a space at byte 1; allowed is printable ASCII except space, '\{' and '\}'$`},
		{"payload too large", line(enqueue(outbox.Task{Queue: "q", ID: "big", Payload: make([]byte, 2000)})),
			`^outbox: enqueue: payload too large: 2000 bytes, at most 1024 \(Config\.MaxPayloadBytes\)$`},
		{"start deadline before the due time", line(enqueue(outbox.Task{Queue: "q", ID: "late", Delay: 4 * time.Second, StartBy: time.Now().Add(2 * time.Second)})),
			`^outbox: enqueue q/late: invalid task: start deadline: \S+Z is before the task's due time \S+Z \(its run-at, or now plus its delay on the database clock\): it could never start$`},
		{"not migrated", line(statsErr),
			`^reconcile: list queues: table "public\.delayq_outbox" not found \(run the migrations: delayq migrate up\)$`},
	} {
		if strings.Contains(c.got, "\n") || !regexp.MustCompile(c.want).MatchString(c.got) {
			t.Errorf("%s:\n got %q\nwant %s", c.name, c.got, c.want)
		}
	}
}
