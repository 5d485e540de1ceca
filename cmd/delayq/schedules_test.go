package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/schedrun"
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

	// Before any process ran them: listed from the file, no last tick, the
	// next one in the schedule's zone and in UTC.
	r = b.run(t, "schedules", "--file", file, "--json")
	r.want(t, 0)
	var got []delayqtype.ScheduleState
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].LastTick != nil || got[0].NextTick == nil || !got[0].UpdatedAt.IsZero() {
		t.Fatalf("schedules before a run: %s", r.stdout)
	}

	// A runner evaluates both once: the heartbeat enqueues its ticks of the
	// lookahead, the New Year schedule none.
	cfg, err := loadSchedules(file)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Schedules[0].Cron, cfg.Schedules[0].Missed, cfg.Schedules[0].CatchUp = "0 0 1 1 *", "", 0
	cfg.Lookahead = time.Minute
	ob, _ := outbox.New(outbox.Config{})
	runner, err := schedrun.New(cfg, ob, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := runner.RunOnce(context.Background(), b.pool); err != nil {
		t.Fatal(err)
	}
	var lastHeartbeat time.Time
	if err := b.pool.QueryRow(context.Background(), `SELECT max(run_at) FROM delayq_outbox WHERE queue = 'ops'`).Scan(&lastHeartbeat); err != nil {
		t.Fatal(err)
	}
	r = b.run(t, "schedules", "--json")
	r.want(t, 0)
	got = nil
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	paris, _ := time.LoadLocation("Europe/Paris")
	newYear := time.Date(time.Now().In(paris).Year()+1, 1, 1, 0, 0, 0, 0, paris)
	if len(got) != 2 || got[0].Name != "heartbeat" || got[1].Name != "nightly-report" {
		t.Fatalf("schedules: %s", r.stdout)
	}
	hb, ny := got[0], got[1]
	// The last tick is the last one enqueued, not when the schedule was first
	// seen; none before the first.
	if hb.LastTick == nil || !hb.LastTick.Equal(lastHeartbeat) || hb.Enqueued == 0 || hb.TimeZone != "UTC" {
		t.Errorf("heartbeat: last tick %v, want %v (the last enqueued): %s", hb.LastTick, lastHeartbeat, r.stdout)
	}
	if ny.LastTick != nil || ny.Enqueued != 0 || ny.TimeZone != "Europe/Paris" || ny.UpdatedAt.IsZero() {
		t.Errorf("nightly-report: want no last tick, zone Europe/Paris: %s", r.stdout)
	}
	// The next tick in the zone (its offset in the JSON) and in UTC.
	if ny.NextTick == nil || ny.NextTickUTC == nil || !ny.NextTick.Equal(newYear) || !ny.NextTickUTC.Equal(newYear) ||
		!strings.Contains(r.stdout, `"next_tick": "`+newYear.Format(time.RFC3339)+`"`) ||
		!strings.Contains(r.stdout, `"next_tick_utc": "`+newYear.UTC().Format(time.RFC3339)+`"`) {
		t.Errorf("nightly-report: next tick %v / %v, want %v in Paris and UTC: %s", ny.NextTick, ny.NextTickUTC, newYear, r.stdout)
	}
	r = b.run(t, "schedules")
	r.want(t, 0, "LAST-TICK", "NEXT-TICK-UTC", "heartbeat", "every 30s", lastHeartbeat.UTC().Format(time.RFC3339Nano),
		newYear.Format(zoneStamp), newYear.UTC().Format(time.RFC3339Nano))
	for line := range strings.SplitSeq(r.stdout, "\n") {
		if strings.HasPrefix(line, "nightly-report") && !strings.Contains(line, ")  -  ") {
			t.Errorf("nightly-report's last tick is not -:\n%s", r.stdout)
		}
	}
}

// TestSchedulesActionsCommand: pause, resume and run one tick now by name; an
// unknown name is one error line, exit 1, and changes nothing; a schedule of the
// file no process ran yet is registered paused with --file.
func TestSchedulesActionsCommand(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "schedules.yaml")
	if err := os.WriteFile(file, []byte(schedulesFile), 0o600); err != nil {
		t.Fatal(err)
	}
	b.run(t, "schedules", "--help").want(t, exitOK, "schedules pause NAME", "schedules resume NAME", "schedules run NAME")
	b.run(t, "schedules", "pause", "--help").want(t, exitOK, "no catch-up", "NAME@run-")
	b.run(t, "schedules", "pause").want(t, exitUsage)

	cfg, err := loadSchedules(file)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Schedules = cfg.Schedules[1:] // the heartbeat, every 30s
	ob, _ := outbox.New(outbox.Config{})
	runner, err := schedrun.New(cfg, ob, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := runner.RunOnce(ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	count := func() (n int) {
		t.Helper()
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	tasks := count()

	for _, action := range []string{"pause", "resume", "run"} {
		r := b.run(t, "schedules", action, "nope")
		r.want(t, exitFailure)
		r.oneLineErr(t, `delayq schedules `+action+`: schedule "nope": no such schedule on this database`)
	}
	if n := count(); n != tasks {
		t.Fatalf("an unknown name enqueued: %d tasks, were %d", n, tasks)
	}

	b.run(t, "schedules", "pause", "heartbeat").want(t, exitOK, "heartbeat paused")
	b.run(t, "schedules", "pause", "heartbeat").want(t, exitOK, "heartbeat was paused already, since ")
	r := b.run(t, "schedules", "--json")
	var got []delayqtype.ScheduleState
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 1 || !got[0].Paused || got[0].PausedAt == nil {
		t.Fatalf("paused: %v %s", err, r.stdout)
	}
	if err := runner.RunOnce(ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != tasks {
		t.Fatalf("a paused schedule enqueued: %d tasks, were %d", n, tasks)
	}

	// Run now: one task, recognisable, whether paused or not.
	r = b.run(t, "schedules", "run", "heartbeat")
	r.want(t, exitOK, "heartbeat: one tick enqueued now: queue ops, task heartbeat@run-")
	id := strings.TrimSpace(r.stdout[strings.Index(r.stdout, "task ")+len("task "):])
	if name, _, ok := schedule.ParseTaskID(id); !ok || name != "heartbeat" {
		t.Fatalf("the run's id %q", id)
	}
	var state string
	if err := b.pool.QueryRow(ctx, `SELECT state FROM delayq_outbox WHERE queue = 'ops' AND task_id = $1`, id).Scan(&state); err != nil || state != "pending" {
		t.Fatalf("the run's task: %q %v", state, err)
	}
	if n := count(); n != tasks+1 {
		t.Fatalf("run: %d tasks, want %d", n, tasks+1)
	}

	b.run(t, "schedules", "resume", "heartbeat").want(t, exitOK, "heartbeat resumed")
	b.run(t, "schedules", "resume", "heartbeat").want(t, exitOK, "heartbeat was not paused")
	r = b.run(t, "schedules", "--json")
	got = nil
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 1 || got[0].Paused || got[0].LastRunID != id {
		t.Fatalf("resumed: %v %s", err, r.stdout)
	}

	// A schedule of the file no process ran: unknown without the file,
	// registered paused with it.
	b.run(t, "schedules", "pause", "nightly-report").want(t, exitFailure)
	b.run(t, "schedules", "pause", "--file", file, "nightly-report").want(t, exitOK, "nightly-report paused")
	r = b.run(t, "schedules", "--json")
	got = nil
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 2 || got[1].Name != "nightly-report" || !got[1].Paused {
		t.Fatalf("declared and paused: %v %s", err, r.stdout)
	}
}
