package main

import (
	"context"
	"fmt"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/reconcile"
)

// statsOptions is what 'delayq stats' was asked.
type statsOptions struct {
	scanFlags
	json, exact bool
	databases   databaseFlags
	dbs         []namedDatabase // --database, parsed
}

const statsHelp = "  delayq stats                            # every queue, as a table\n" +
	"  delayq stats --queue payment --json     # one queue, as JSON\n" +
	"  delayq stats --database eu1=postgres://db-eu1/app --database us1=postgres://db-us1/app\n" +
	"                                          # several outbox databases: each one's rows and the total\n\n" +
	"Columns: outbox rows by state (Postgres); READY (due or not), DUE (due now),\n" +
	"ACTIVE (leased), EXPIRED (leases past their deadline, for the reaper) and R-DEAD\n" +
	"in Redis; PENDING-AGE: how long the oldest due pending row has waited for the\n" +
	"relay; LATENESS: how long the earliest ready task has been due (worker lag);\n" +
	"OVERDUE: ready tasks due more than a minute ago and not claimed.\n" +
	"PENDING, QUEUED and DEAD are exact (counted over their indexes). Above\n" +
	"50,000 outbox rows DONE and CANCELLED are estimates from the planner's\n" +
	"statistics (marked ~; \"estimated\": true in JSON); --exact counts them,\n" +
	"reading every row. With --database (repeated), the DATABASE column names each\n" +
	"database's rows and TOTAL rows sum each queue over them (the ages: the largest).\n"

func (o *statsOptions) parse(m *Main, args []string) error {
	fs := newFlagSet(m, "stats", "stats [flags]", statsHelp)
	o.register(fs, m, true, "only this queue (repeat, or comma-separated; default: every queue)")
	fs.BoolVar(&o.json, "json", false, "print the figures as JSON")
	fs.BoolVar(&o.exact, "exact", false, "count the done and cancelled rows exactly, reading every row (default: estimated above 50,000 rows)")
	registerDatabases(fs, &o.databases)
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	var err error
	if o.dbs, err = resolveDatabases(fs, &o.databases); err != nil {
		return err
	}
	return o.validate(o.options())
}

func (o *statsOptions) options() reconcile.Options {
	opts := o.scanFlags.options()
	opts.ExactCounts = o.exact
	return opts
}

// runStats calls internal/reconcile for the counts (the client's Stats has no
// exact counts) and the client for the pauses.
func runStats(ctx context.Context, m *Main, args []string) error {
	var o statsOptions
	if err := o.parse(m, args); err != nil {
		return err
	}
	if len(o.dbs) > 0 {
		return runStatsOf(ctx, m, &o)
	}
	s, err := o.conn.openStores(ctx, true)
	if err != nil {
		return err
	}
	defer s.close()
	st, err := reconcile.Stats(ctx, s.pool, s.dq, o.options())
	if err != nil {
		return err
	}
	if o.json {
		if st == nil {
			st = []reconcile.QueueStats{}
		}
		return writeJSON(m.Stdout, st)
	}
	if len(st) == 0 {
		fmt.Fprintln(m.Stdout, "no queues")
		return nil
	}
	paused := pausedQueues(ctx, s.client) // queue.go
	tw := newTable(m.Stdout, "QUEUE\tPENDING\tQUEUED\tDONE\tDEAD\tCANCELLED\tWAITING\tREADY\tDUE\tACTIVE\tEXPIRED\tR-DEAD\tOVERDUE\tPENDING-AGE\tLATENESS\tPAUSED")
	for _, s := range st {
		p := s.Postgres
		mark := ""
		if s.Estimated {
			mark = "~"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s%d\t%d\t%s%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", s.Queue,
			p[delayqtype.StatePending], p[delayqtype.StateQueued], mark, p[delayqtype.StateDone], p[delayqtype.StateDead], mark, p[delayqtype.StateCancelled], p[delayqtype.StateWaiting],
			s.Ready, s.DueNow, s.Active, s.ExpiredLeases, s.Dead, s.Overdue,
			age(s.OldestPendingAge), age(s.OldestDueLateness), paused(s.Queue))
	}
	return tw.Flush()
}

// databaseStats is one database's figures in 'delayq stats --database'.
type databaseStats struct {
	Database string                 `json:"database"`
	Queues   []reconcile.QueueStats `json:"queues"`
}

// runStatsOf is 'delayq stats' over several databases: each database's rows,
// then the total of each queue.
func runStatsOf(ctx context.Context, m *Main, o *statsOptions) error {
	var per []databaseStats
	paused := map[string]func(string) string{}
	err := forEachDatabase(ctx, o.conn, o.dbs, func(key string, s *stores) error {
		st, err := reconcile.Stats(ctx, s.pool, s.dq, o.options())
		if err != nil {
			return err
		}
		if st == nil {
			st = []reconcile.QueueStats{}
		}
		per = append(per, databaseStats{Database: key, Queues: st})
		if !o.json {
			paused[key] = pausedQueues(ctx, s.client)
		}
		return nil
	})
	if err != nil {
		return err
	}
	total := totalStats(per)
	if o.json {
		return writeJSON(m.Stdout, struct {
			Databases []databaseStats        `json:"databases"`
			Total     []reconcile.QueueStats `json:"total"`
		}{per, total})
	}
	if len(total) == 0 {
		fmt.Fprintln(m.Stdout, "no queues")
		return nil
	}
	tw := newTable(m.Stdout, "DATABASE\tQUEUE\tPENDING\tQUEUED\tDONE\tDEAD\tCANCELLED\tWAITING\tREADY\tDUE\tACTIVE\tEXPIRED\tR-DEAD\tOVERDUE\tPENDING-AGE\tLATENESS\tPAUSED")
	row := func(db string, s reconcile.QueueStats, paused string) {
		p := s.Postgres
		mark := ""
		if s.Estimated {
			mark = "~"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s%d\t%d\t%s%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", db, s.Queue,
			p[delayqtype.StatePending], p[delayqtype.StateQueued], mark, p[delayqtype.StateDone], p[delayqtype.StateDead], mark, p[delayqtype.StateCancelled], p[delayqtype.StateWaiting],
			s.Ready, s.DueNow, s.Active, s.ExpiredLeases, s.Dead, s.Overdue,
			age(s.OldestPendingAge), age(s.OldestDueLateness), paused)
	}
	for _, d := range per {
		for _, s := range d.Queues {
			row(d.Database, s, paused[d.Database](s.Queue))
		}
	}
	for _, s := range total {
		row("TOTAL", s, "")
	}
	return tw.Flush()
}

// totalStats sums each queue's figures over the databases (reconcile.TotalStats).
func totalStats(per []databaseStats) []reconcile.QueueStats {
	queues := make([][]reconcile.QueueStats, len(per))
	for i, d := range per {
		queues[i] = d.Queues
	}
	total, _ := reconcile.TotalStats(queues)
	return total
}
