package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/schedule"
)

const schedulesFile = `
schedules:
  - name: nightly-report
    queue: reports
    cron: "0 3 * * *"
    timezone: Europe/Paris
    missed: catch-up
    catch_up: 1
  - name: heartbeat
    queue: ops
    every: 30s
`

func TestSchedulesCommand(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "schedules.yaml")
	if err := os.WriteFile(file, []byte(schedulesFile), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("schedules: [{name: x, queue: q, every: 1s, cron: '* * * * *'}]"), 0o600); err != nil {
		t.Fatal(err)
	}

	b.run(t, "schedules", "--help").want(t, 0, "delayq schedules", "--file", "catch_up", "NEXT-TICK")
	b.run(t, "schedules").want(t, 0, "no schedules")
	b.run(t, "schedules", "--check", "--file", file).want(t, 0, "nightly-report", "cron 0 3 * * * (Europe/Paris)", "heartbeat", "every 30s")
	r := b.run(t, "schedules", "--check", "--file", bad)
	r.want(t, 2)
	r.oneLineErr(t, "both cron and every")
	b.run(t, "schedules", "--check").want(t, 2)
	r = b.run(t, "relay", "--schedules", bad)
	r.want(t, 2)
	r.oneLineErr(t, "both cron and every")

	// A relay's runner evaluates the heartbeat once: it is listed from the
	// database, with its last tick; the file's other schedule from the file.
	cfg, err := schedule.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Schedules = cfg.Schedules[1:]
	ob, _ := outbox.New(outbox.Config{})
	runner, err := schedule.NewRunner(cfg, ob, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := runner.RunOnce(context.Background(), b.pool); err != nil {
		t.Fatal(err)
	}
	r = b.run(t, "schedules", "--file", file, "--json")
	r.want(t, 0)
	var got []schedule.State
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "heartbeat" || got[0].LastTick.IsZero() || got[0].NextTick == nil ||
		got[1].Name != "nightly-report" || !got[1].LastTick.IsZero() || got[1].NextTick == nil {
		t.Fatalf("schedules: %s", r.stdout)
	}
	b.run(t, "schedules").want(t, 0, "heartbeat", "every 30s", "LAST-TICK")
}
