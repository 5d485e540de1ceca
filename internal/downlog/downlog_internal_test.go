package downlog

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
)

func TestTrackerLogsOncePerChange(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	h := New(slog.New(slog.NewTextHandler(&buf, nil)), "relay", "Redis")
	count := func(s string) int { return strings.Count(buf.String(), s) }
	err := errors.New("connection refused")

	h.OK()
	for range 5 {
		h.Fail("enqueue", err)
	}
	h.OK()
	h.OK()
	if d, u := count("unreachable"), count("reachable again"); d != 1 || u != 1 {
		t.Fatalf("one outage: %d down and %d up logs, want 1 and 1:\n%s", d, u, buf.String())
	}
	// A relapse right after recovery (a dead pooled connection) is not a new
	// outage, unless it lasts.
	h.Fail("begin", err)
	h.OK()
	if d, u := count("unreachable"), count("reachable again"); d != 1 || u != 1 {
		t.Fatalf("relapse within the grace: %d down and %d up logs, want still 1 and 1", d, u)
	}
	h.upAt = time.Now().Add(-time.Minute)
	h.Fail("begin", err)
	h.since = time.Now().Add(-Grace) // it lasts
	h.Fail("begin", err)
	h.OK()
	if d, u := count("unreachable"), count("reachable again"); d != 2 || u != 2 {
		t.Fatalf("second outage: %d down and %d up logs, want 2 and 2:\n%s", d, u, buf.String())
	}
}

func TestOutage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{errors.New("dial tcp 127.0.0.1:6379: connect: connection refused"), true},
		{&pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"}, true},
		{&pgconn.PgError{Severity: "ERROR", Code: "08006"}, true},
		{&pgconn.PgError{Severity: "ERROR", Code: "42P01", Message: `relation "delayq_outbox" does not exist`}, false},
		{redis.ErrClosed, true},
		{redis.Nil, false},
		{fmt.Errorf("claim: %w", redisReply("ERR unknown command")), false},
		{nil, false},
	} {
		if got := Outage(c.err); got != c.want {
			t.Errorf("Outage(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// redisReply is an error reply of the server, as go-redis returns it.
type redisReply string

func (e redisReply) Error() string { return string(e) }
func (redisReply) RedisError()     {}
