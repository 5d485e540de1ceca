package main

import (
	"context"
	"fmt"
	"time"

	"github.com/delayq/delayq/schedule"
)

func runSchedules(ctx context.Context, m *Main, args []string) error {
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
			"Columns: LAST-TICK is the last tick enqueued (or dropped), NEXT-TICK the one after\n"+
			"it; ENQUEUED and MISSED count ticks; SEEN is when a relay last evaluated it.\n")
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
		if declared, err = schedule.Load(*file); err != nil {
			return usagef("--file: %v", err)
		}
	} else if *check {
		return usagef("--check needs --file")
	}
	var states []schedule.State
	if !*check {
		pool, err := conn.openPostgres(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		if states, err = schedule.List(ctx, pool, conn.schema); err != nil {
			return err
		}
	}
	// Schedules of the file that no relay ran yet: their next tick from now.
	known := map[string]bool{}
	for _, s := range states {
		known[s.Name] = true
	}
	now := time.Now()
	for _, s := range declared.Schedules {
		if known[s.Name] {
			continue
		}
		spec, _ := schedule.Spec(s)
		st := schedule.State{Name: s.Name, Queue: s.Queue, Spec: spec}
		if next, err := schedule.Next(s, now); err == nil && !next.IsZero() {
			st.NextTick = &next
		}
		states = append(states, st)
	}
	if *asJSON {
		if states == nil {
			states = []schedule.State{}
		}
		return writeJSON(m.Stdout, states)
	}
	if len(states) == 0 {
		fmt.Fprintln(m.Stdout, "no schedules")
		return nil
	}
	tw := newTable(m.Stdout, "NAME\tQUEUE\tSPEC\tLAST-TICK\tNEXT-TICK\tENQUEUED\tMISSED\tSEEN")
	for _, s := range states {
		next := "-"
		if s.NextTick != nil {
			next = stamp(*s.NextTick)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", s.Name, s.Queue, s.Spec,
			stamp(s.LastTick), next, s.Enqueued, s.Missed, stamp(s.UpdatedAt))
	}
	return tw.Flush()
}
