package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/reconcile"
)

func runStats(ctx context.Context, m *Main, args []string) error {
	var conn connFlags
	var queues queueList
	fs := newFlagSet(m, "stats", "stats [flags]",
		"  delayq stats                            # every queue, as a table\n"+
			"  delayq stats --queue payment --json     # one queue, as JSON\n\n"+
			"Columns: outbox rows by state (Postgres); READY (due or not), DUE (due now),\n"+
			"ACTIVE (leased), EXPIRED (leases past their deadline, for the reaper) and R-DEAD\n"+
			"in Redis; PENDING-AGE: how long the oldest due pending row has waited for the\n"+
			"relay; LATENESS: how long the earliest ready task has been due (worker lag);\n"+
			"OVERDUE: ready tasks due more than a minute ago and not claimed.\n"+
			"PENDING, QUEUED and DEAD are exact (counted over their indexes). Above\n"+
			"50,000 outbox rows DONE and CANCELLED are estimates from the planner's\n"+
			"statistics (marked ~; \"estimated\": true in JSON); --exact counts them,\n"+
			"reading every row.\n")
	conn.register(fs, m, true, true)
	fs.Var(&queues, "queue", "only this queue (repeat, or comma-separated; default: every queue)")
	asJSON := fs.Bool("json", false, "print the figures as JSON")
	exact := fs.Bool("exact", false, "count the done and cancelled rows exactly, reading every row (default: estimated above 50,000 rows)")
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	opts := reconcile.Options{Queues: queues.list, Schema: conn.schema, ExactCounts: *exact}
	pool, dq, closeAll, err := openStores(ctx, &conn, opts, true)
	if err != nil {
		return err
	}
	defer closeAll()
	st, err := reconcile.Stats(ctx, pool, dq, opts)
	if err != nil {
		return err
	}
	if *asJSON {
		if st == nil {
			st = []reconcile.QueueStats{}
		}
		return writeJSON(m.Stdout, st)
	}
	if len(st) == 0 {
		fmt.Fprintln(m.Stdout, "no queues")
		return nil
	}
	paused := pausedQueues(ctx, pool, conn.schema) // queue.go
	tw := tabwriter.NewWriter(m.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tPENDING\tQUEUED\tDONE\tDEAD\tCANCELLED\tREADY\tDUE\tACTIVE\tEXPIRED\tR-DEAD\tOVERDUE\tPENDING-AGE\tLATENESS\tPAUSED")
	for _, s := range st {
		p := s.Postgres
		mark := ""
		if s.Estimated {
			mark = "~"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s%d\t%d\t%s%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", s.Queue,
			p[delayqtype.StatePending], p[delayqtype.StateQueued], mark, p[delayqtype.StateDone], p[delayqtype.StateDead], mark, p[delayqtype.StateCancelled],
			s.Ready, s.DueNow, s.Active, s.ExpiredLeases, s.Dead, s.Overdue,
			age(s.OldestPendingAge), age(s.OldestDueLateness), paused(s.Queue))
	}
	return tw.Flush()
}

// age prints a lag for a table: "-" for none, else rounded to what matters.
func age(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
