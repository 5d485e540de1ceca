package main

import (
	"context"
	"fmt"

	"github.com/delayq/delayq/internal/reconcile"
)

// checkOptions is what 'delayq check' was asked.
type checkOptions struct {
	scanFlags
	json, deep bool
}

const checkHelp = "  delayq check                            # every queue; exit 1 if anything disagrees\n" +
	"  delayq check --queue payment --json     # one queue, the list as JSON\n" +
	"  delayq check || delayq reconcile        # a pre-launch gate in a script\n\n" +
	"For each task, the task hash status, its ZSET membership and the outbox row must\n" +
	"agree (the task hash is also the Redis dedupe record: there is no separate key).\n" +
	"Every inconsistency is listed with its kind, queue and id; each is read a second\n" +
	"time before it is listed. Nothing is changed: 'delayq reconcile' repairs.\n"

func (o *checkOptions) parse(m *Main, args []string) error {
	fs := newFlagSet(m, "check", "check [flags]", checkHelp)
	o.register(fs, m, true, "only this queue (repeat, or comma-separated; default: every queue)")
	fs.BoolVar(&o.json, "json", false, "print the inconsistencies as a JSON array")
	o.registerBatch(fs, "rows or Redis ids per step, 1..1000")
	fs.BoolVar(&o.deep, "deep", false, "also SCAN the whole keyspace for task hashes outside every ZSET (costs a pass over every key)")
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	return o.validate(o.options())
}

func (o *checkOptions) options() reconcile.Options {
	opts := o.scanFlags.options()
	opts.Deep = o.deep
	return opts
}

// runCheck calls internal/reconcile: the client's Check has no batch or deep
// scan.
func runCheck(ctx context.Context, m *Main, args []string) error {
	var o checkOptions
	if err := o.parse(m, args); err != nil {
		return err
	}
	s, err := o.conn.openStores(ctx, true)
	if err != nil {
		return err
	}
	defer s.close()
	incs, err := reconcile.Check(ctx, s.pool, s.dq, o.options())
	if err != nil {
		if isUsage(err) {
			return usagef("%v", err)
		}
		return err
	}
	if err := writeInconsistencies(m, incs, o.json); err != nil {
		return err
	}
	if len(incs) > 0 {
		return fmt.Errorf("%d inconsistencies found (run 'delayq reconcile' to repair)", len(incs))
	}
	return nil
}

func writeInconsistencies(m *Main, incs []reconcile.Inconsistency, asJSON bool) error {
	switch {
	case asJSON:
		if incs == nil {
			incs = []reconcile.Inconsistency{}
		}
		return writeJSON(m.Stdout, incs)
	case len(incs) == 0:
		fmt.Fprintln(m.Stdout, "consistent: no inconsistencies")
		return nil
	}
	tw := newTable(m.Stdout, "KIND\tQUEUE\tID\tPOSTGRES\tREDIS")
	for _, inc := range incs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", inc.Kind, inc.Queue, inc.ID, inc.Postgres, inc.Redis)
	}
	return tw.Flush()
}
