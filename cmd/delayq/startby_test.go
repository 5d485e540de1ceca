package main

import (
	"context"
	"testing"
	"time"
)

// TestEnqueueStartByAgainstTheDueTime: --start-by is refused (exit 2, one line,
// nothing written) when it is before the due time, whether that comes from
// --delay (now plus the delay on the database clock) or --at, or already past;
// a zero --at or --start-by is refused rather than read as "now" or "none".
// Before, the --delay, past and zero cases exited 0.
func TestEnqueueStartByAgainstTheDueTime(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	now := time.Now()
	ts := func(d time.Duration) string { return now.Add(d).UTC().Format(time.RFC3339Nano) }
	for _, c := range []struct {
		name string
		args []string
		says string
	}{
		{"delay past the deadline", []string{"--delay", "4s", "--start-by", ts(2 * time.Second)}, "before the task's due time"},
		{"at past the deadline", []string{"--at", ts(4 * time.Second), "--start-by", ts(2 * time.Second)}, "before RunAt"},
		{"deadline in the past", []string{"--start-by", ts(-time.Minute)}, "before the task's due time"},
		{"deadline in the past, at in the past", []string{"--at", ts(-time.Hour), "--start-by", ts(-time.Minute)}, "before the task's due time"},
		{"zero at", []string{"--at", "0001-01-01T00:00:00Z"}, "the zero time"},
		{"zero deadline", []string{"--start-by", "0001-01-01T00:00:00Z"}, "the zero time"},
	} {
		r := b.run(t, append([]string{"enqueue", "--queue", "late", "--id", "x"}, c.args...)...)
		if r.code != exitUsage {
			t.Errorf("%s: exit %d, want %d\nstdout: %s\nstderr: %s", c.name, r.code, exitUsage, r.stdout, r.stderr)
			continue
		}
		r.oneLineErr(t, c.says)
	}
	var n int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM delayq_outbox WHERE queue = 'late'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows written for refused enqueues, %v", n, err)
	}
	b.run(t, "reschedule", "--queue", "late", "--id", "x", "--at", "0001-01-01T00:00:00Z").want(t, exitUsage)

	// Accepted: a deadline after now plus the delay, and one at --at.
	b.run(t, "enqueue", "--queue", "late", "--id", "ok-1", "--delay", "4s", "--start-by", ts(time.Hour)).want(t, exitOK, "enqueued late/ok-1")
	b.run(t, "enqueue", "--queue", "late", "--id", "ok-2", "--at", ts(time.Hour), "--start-by", ts(time.Hour)).want(t, exitOK, "enqueued late/ok-2")
}
