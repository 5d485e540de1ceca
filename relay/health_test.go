package relay

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestHealthLogsOncePerChange(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	h := newHealth("Redis", slog.New(slog.NewTextHandler(&buf, nil)))
	count := func(s string) int { return strings.Count(buf.String(), s) }
	err := errors.New("connection refused")

	h.ok()
	for range 5 {
		h.fail("enqueue", err)
	}
	h.ok()
	h.ok()
	if d, u := count("unreachable"), count("reachable again"); d != 1 || u != 1 {
		t.Fatalf("one outage: %d down and %d up logs, want 1 and 1:\n%s", d, u, buf.String())
	}
	// A relapse right after recovery (a dead pooled connection) is not a new
	// outage, unless it lasts.
	h.fail("begin", err)
	h.ok()
	if d, u := count("unreachable"), count("reachable again"); d != 1 || u != 1 {
		t.Fatalf("relapse within the grace: %d down and %d up logs, want still 1 and 1", d, u)
	}
	h.upAt = time.Now().Add(-time.Minute)
	h.fail("begin", err)
	h.since = time.Now().Add(-healthGrace) // it lasts
	h.fail("begin", err)
	h.ok()
	if d, u := count("unreachable"), count("reachable again"); d != 2 || u != 2 {
		t.Fatalf("second outage: %d down and %d up logs, want 2 and 2:\n%s", d, u, buf.String())
	}
}

func TestBackoffBounds(t *testing.T) {
	t.Parallel()
	b := newBackoff(100*time.Millisecond, time.Second)
	for i := range 50 {
		d := b.next()
		hi := min(time.Second, 100*time.Millisecond<<min(i, 20))
		if d < hi/2 || d > hi {
			t.Fatalf("delay %d = %v, want in [%v, %v]", i, d, hi/2, hi)
		}
	}
	b.reset()
	if d := b.next(); d > 100*time.Millisecond {
		t.Errorf("after reset: %v", d)
	}
}
