package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/schedrun"
	"github.com/delayq/delayq/internal/schedspec"
	"github.com/delayq/delayq/schedule"
)

func runSchedules(ctx context.Context, m *Main, args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "pause", "resume", "run":
			return runScheduleAction(ctx, m, args[0], args[1:])
		}
	}
	var conn connFlags
	fs := newFlagSet(m, "schedules", "schedules [flags]",
		"  delayq schedules                          # every schedule a relay ran, with its last and next tick\n"+
			"  delayq schedules --file schedules.yaml    # also those of the file no relay ran yet\n"+
			"  delayq schedules --file schedules.yaml --check   # only check the file; no database\n\n"+
			"A relay started with --schedules FILE enqueues each tick of each schedule into the\n"+
			"outbox, a little before it falls due, as a task with the id <name>@<tick time UTC>;\n"+
			"the outbox's unique key makes every tick happen once however many relays run.\n"+
			"The file (YAML):\n\n"+
			"  lookahead: 10s        # ticks due within it are enqueued (default 10s)\n"+
			"  grace: 1m             # a tick this late without a relay is missed (default 1m)\n"+
			"  schedules:\n"+
			"    - name: nightly-report\n"+
			"      queue: reports\n"+
			"      cron: \"0 3 * * *\"        # 5 fields, 6 with seconds, or @hourly, @every 90m ...\n"+
			"      timezone: Europe/Paris   # cron only; default UTC\n"+
			"      payload: '{\"kind\":\"nightly\"}'\n"+
			"      missed: catch-up         # skip (default): drop missed ticks; catch-up: run the\n"+
			"      catch_up: 1              #   most recent catch_up (1..1000) of them at once\n"+
			"    - name: heartbeat\n"+
			"      queue: ops\n"+
			"      every: 30s               # ticks at the Unix epoch + n * every\n"+
			"      max_attempts: 3\n\n"+
			"Schedules declared in Go (delayq.Client.Schedule) are listed too, once a worker ran them.\n\n"+
			"Actions (see 'delayq schedules pause --help'):\n"+
			"  delayq schedules pause NAME     # no tick enqueued until resumed; the ticks that fall are missed\n"+
			"  delayq schedules resume NAME    # goes on from now: the paused ticks are not caught up\n"+
			"  delayq schedules run NAME       # enqueue one tick now (a task of its own), ticks unchanged\n\n"+
			"Columns: LAST-TICK is the last tick enqueued (- before the first); NEXT-TICK the next\n"+
			"one, in the schedule's time zone, and NEXT-TICK-UTC the same in UTC; ENQUEUED and\n"+
			"MISSED count ticks; SEEN is when a relay or worker last evaluated it.\n")
	conn.register(fs, m, true, false)
	file := fs.String("file", "", "schedules `file` (YAML), as given to delayq relay --schedules")
	check := fs.Bool("check", false, "with --file: check the file and list its schedules' next ticks, without a database")
	asJSON := fs.Bool("json", false, "print the schedules as JSON")
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	var declared schedule.Config
	if *file != "" {
		var err error
		if declared, err = loadSchedules(*file); err != nil {
			return usagef("--file: %v", err)
		}
	} else if *check {
		return usagef("--check needs --file")
	}
	var states []delayqtype.ScheduleState
	if *check {
		states = schedrun.Declared(declared.Schedules, time.Now(), nil)
	} else {
		st, err := conn.openStores(ctx, false)
		if err != nil {
			return err
		}
		defer st.close()
		// The file's schedules that no process ran yet are listed with their
		// next tick from now.
		if err := st.client.Schedule(declared.Schedules...); err != nil {
			return usagef("--file: %v", err)
		}
		if states, err = st.client.Schedules(ctx); err != nil {
			return err
		}
	}
	if *asJSON {
		if states == nil {
			states = []delayqtype.ScheduleState{}
		}
		return writeJSON(m.Stdout, states)
	}
	if len(states) == 0 {
		fmt.Fprintln(m.Stdout, "no schedules")
		return nil
	}
	tw := newTable(m.Stdout, "NAME\tQUEUE\tSPEC\tLAST-TICK\tNEXT-TICK\tNEXT-TICK-UTC\tENQUEUED\tMISSED\tSEEN")
	for _, s := range states {
		last, next, nextUTC := "-", "-", "-"
		if s.LastTick != nil {
			last = stamp(*s.LastTick)
		}
		if s.NextTick != nil {
			next, nextUTC = s.NextTick.Format(zoneStamp), stamp(*s.NextTickUTC)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", s.Name, s.Queue, s.Spec,
			last, next, nextUTC, s.Enqueued, s.Missed, stamp(s.UpdatedAt))
	}
	return tw.Flush()
}

const scheduleActionHelp = `  delayq schedules pause nightly-report
  delayq schedules resume nightly-report
  delayq schedules run nightly-report
  delayq schedules pause --file schedules.yaml nightly-report   # before any relay ran it

pause: from the moment it returns, no relay or worker enqueues a tick of NAME
(each reads the pause at its next evaluation, in the same transaction as the
ticks); ticks already enqueued, due within the lookahead (10s by default), still
run: cancel them as any task. The ticks that fall while it is paused are counted
as MISSED and never enqueued.
resume: the schedule goes on with its first tick after now; the ticks that fell
while it was paused stay missed, whatever its missed-tick policy (no catch-up).
run: enqueue one tick of NAME now, through the outbox as any tick (its queue,
payload and max attempts), as the task NAME@run-<time>-<nonce>
(schedule.ParseTaskID reads it: the tick's time is when it was asked for); the
schedule's own ticks are unchanged, and it runs paused or not. Each command is
one run: run it again and there are two.

NAME is a schedule a relay or worker ran on this database; with --file, also one
of the file's that none ran yet (registered now; its first runner finds it
paused). An unknown NAME is an error (exit 1) and changes nothing.
`

// runScheduleAction pauses, resumes or runs one tick of a schedule now.
func runScheduleAction(ctx context.Context, m *Main, action string, args []string) error {
	var conn connFlags
	fs := newFlagSet(m, "schedules "+action, "schedules "+action+" [flags] NAME", scheduleActionHelp)
	conn.register(fs, m, true, false)
	file := fs.String("file", "", "schedules `file` (YAML): its schedules no process ran yet can be paused or run")
	if err := parseArgs(fs, args, 1); err != nil {
		return err
	}
	name := fs.Arg(0)
	var declared []schedrun.ScheduleDecl
	if *file != "" {
		cfg, err := loadSchedules(*file)
		if err != nil {
			return usagef("--file: %v", err)
		}
		if declared, err = schedrun.Declare(cfg.Schedules); err != nil {
			return usagef("--file: %v", err)
		}
	}
	st, err := conn.openStores(ctx, false)
	if err != nil {
		return err
	}
	defer st.close()
	err = scheduleAction(ctx, m, schedrun.NewActions(st.client.Outbox()), st, action, name, declared)
	if errors.Is(err, schedrun.ErrNotFound) {
		return fmt.Errorf("%w on this database ('delayq schedules' lists them; --file for one of a file no relay ran yet)", err)
	}
	return err
}

func scheduleAction(ctx context.Context, m *Main, act *schedrun.Actions, st *stores, action, name string, declared []schedrun.ScheduleDecl) error {
	switch action {
	case "pause":
		ch, err := act.Pause(ctx, st.pool, name, declared)
		if err != nil {
			return err
		}
		if !ch.Changed {
			fmt.Fprintf(m.Stdout, "%s was paused already, since %s\n", name, stamp(ch.At))
			return nil
		}
		fmt.Fprintf(m.Stdout, "%s paused: no tick enqueued until it is resumed\n", name)
	case "resume":
		ch, err := act.Resume(ctx, st.pool, name)
		if err != nil {
			return err
		}
		if !ch.Changed {
			fmt.Fprintf(m.Stdout, "%s was not paused\n", name)
			return nil
		}
		fmt.Fprintf(m.Stdout, "%s resumed: its next tick after now is enqueued as usual\n", name)
	case "run":
		run, err := act.RunNow(ctx, st.pool, name, schedspec.NewRunKey(time.Now()), declared)
		if err != nil {
			return err
		}
		fmt.Fprintf(m.Stdout, "%s: one tick enqueued now: queue %s, task %s\n", name, run.Queue, run.ID)
	}
	return nil
}

// zoneStamp writes a time in its schedule's zone, with the zone's abbreviation.
const zoneStamp = "2006-01-02T15:04:05Z07:00 MST"

// loadSchedules reads the schedules file at path (see schedule.Parse).
func loadSchedules(path string) (schedule.Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return schedule.Config{}, err
	}
	c, err := schedule.Parse(b)
	if err != nil {
		return schedule.Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
