package schedule

import (
	"errors"
	"testing"
	"time"
)

func TestParseFile(t *testing.T) {
	t.Parallel()
	c, err := Parse([]byte(`
lookahead: 5s
schedules:
  - name: nightly-report
    queue: reports
    cron: "0 3 * * *"
    timezone: Europe/Paris
    payload: '{"kind":"nightly"}'
    missed: catch-up
    catch_up: 2
  - name: heartbeat
    queue: ops
    every: 30s
    max_attempts: 3
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Lookahead != 5*time.Second || len(c.Schedules) != 2 || string(c.Schedules[0].Payload) != `{"kind":"nightly"}` ||
		c.Schedules[0].CatchUp != 2 || c.Schedules[1].Every != 30*time.Second || c.Schedules[1].MaxAttempts != 3 {
		t.Fatalf("parsed %+v", c)
	}
	if c, err := Parse(nil); err != nil || len(c.Schedules) != 0 {
		t.Fatalf("empty file: %+v, %v", c, err)
	}
	for _, bad := range []string{
		"schedules: [{name: a, queue: q, every: 1s, colour: red}]",
		"schedules: [{name: a, queue: q}]",
		"schedules: [{name: a, queue: q, every: 1s}, {name: a, queue: q, every: 2s}]",
		"schedules: [{name: a, queue: q, every: 1s, catch_up: 3}]",
		"schedules: [{name: a, queue: q, cron: '* * * * *', missed: catch-up, catch_up: 1001}]",
		"schedules: [{name: a, queue: 'q q', every: 1s}]",
		"schedules: [{name: a, queue: q, every: 1s, timezone: UTC}]",
		"schedules: [{name: a, queue: q, cron: 'CRON_TZ=UTC * * * * *'}]",
		"lookahead: -1s",
	} {
		if _, err := Parse([]byte(bad)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", bad, err)
		}
	}
}
