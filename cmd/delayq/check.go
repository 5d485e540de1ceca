package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/delayq/delayq/internal/reconcile"
)

func runCheck(ctx context.Context, m *Main, args []string) error {
	var conn connFlags
	var queues queueList
	fs := newFlagSet(m, "check", "check [flags]",
		"  delayq check                            # every queue; exit 1 if anything disagrees\n"+
			"  delayq check --queue payment --json     # one queue, the list as JSON\n"+
			"  delayq check || delayq reconcile        # a pre-launch gate in a script\n\n"+
			"For each task, the task hash status, its ZSET membership and the outbox row must\n"+
			"agree (the task hash is also the Redis dedupe record: there is no separate key).\n"+
			"Every inconsistency is listed with its kind, queue and id; each is read a second\n"+
			"time before it is listed. Nothing is changed: 'delayq reconcile' repairs.\n")
	conn.register(fs, m, true, true)
	fs.Var(&queues, "queue", "only this queue (repeat, or comma-separated; default: every queue)")
	asJSON := fs.Bool("json", false, "print the inconsistencies as a JSON array")
	batch := fs.Int("batch", 500, "rows or Redis ids per step, 1..1000")
	deep := fs.Bool("deep", false, "also SCAN the whole keyspace for task hashes outside every ZSET (costs a pass over every key)")
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	if *batch < 1 || *batch > 1000 {
		return usagef("--batch %d: 1..1000", *batch)
	}
	opts := reconcile.Options{Queues: queues.list, Schema: conn.schema, BatchSize: *batch, Deep: *deep}
	pool, dq, closeAll, err := openStores(ctx, &conn, opts, true)
	if err != nil {
		return err
	}
	defer closeAll()
	incs, err := reconcile.Check(ctx, pool, dq, opts)
	if err != nil {
		if isUsage(err) {
			return usagef("%v", err)
		}
		return err
	}
	if *asJSON {
		if incs == nil {
			incs = []reconcile.Inconsistency{}
		}
		if err := writeJSON(m.Stdout, incs); err != nil {
			return err
		}
	} else if len(incs) == 0 {
		fmt.Fprintln(m.Stdout, "consistent: no inconsistencies")
	} else {
		tw := tabwriter.NewWriter(m.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KIND\tQUEUE\tID\tPOSTGRES\tREDIS")
		for _, inc := range incs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", inc.Kind, inc.Queue, inc.ID, inc.Postgres, inc.Redis)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(incs) > 0 {
		return fmt.Errorf("%d inconsistencies found (run 'delayq reconcile' to repair)", len(incs))
	}
	return nil
}
