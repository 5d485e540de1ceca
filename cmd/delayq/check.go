package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/delayq/delayq/internal/reconcile"
)

// checkOptions is what 'delayq check' was asked.
type checkOptions struct {
	scanFlags
	json, deep bool
	databases  databaseFlags
	dbs        []namedDatabase // --database, parsed
}

const checkHelp = "  delayq check                            # every queue; exit 1 if anything disagrees\n" +
	"  delayq check --queue payment --json     # one queue, the list as JSON\n" +
	"  delayq check || delayq reconcile        # a pre-launch gate in a script\n" +
	"  delayq check --database eu1=postgres://db-eu1/app --database us1=postgres://db-us1/app\n" +
	"                                          # several outbox databases: each one checked, the total counted\n\n" +
	"For each task, the task hash status, its ZSET membership and the outbox row must\n" +
	"agree (the task hash is also the Redis dedupe record: there is no separate key).\n" +
	"Every inconsistency is listed with its kind, queue and id; each is read a second\n" +
	"time before it is listed. Nothing is changed: 'delayq reconcile' repairs.\n" +
	"With --database (repeated), the DATABASE column (\"database\" in JSON) names\n" +
	"each inconsistency's database, and the last line counts them per database.\n"

func (o *checkOptions) parse(m *Main, args []string) error {
	fs := newFlagSet(m, "check", "check [flags]", checkHelp)
	o.register(fs, m, true, "only this queue (repeat, or comma-separated; default: every queue)")
	fs.BoolVar(&o.json, "json", false, "print the inconsistencies as a JSON array")
	o.registerBatch(fs, "rows or Redis ids per step, 1..1000")
	fs.BoolVar(&o.deep, "deep", false, "also SCAN the whole keyspace for task hashes outside every ZSET (costs a pass over every key)")
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
	if len(o.dbs) > 0 {
		return runCheckOf(ctx, m, &o)
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

// databaseInconsistency is an inconsistency of one of several databases.
type databaseInconsistency struct {
	Database string `json:"database"`
	reconcile.Inconsistency
}

// runCheckOf is 'delayq check' over several databases: every database checked
// in turn, its inconsistencies listed under its key, their count per database
// and in total.
func runCheckOf(ctx context.Context, m *Main, o *checkOptions) error {
	all := []databaseInconsistency{}
	counts := make([]string, 0, len(o.dbs))
	err := forEachDatabase(ctx, o.conn, o.dbs, func(key string, s *stores) error {
		incs, err := reconcile.Check(ctx, s.pool, s.dq, o.options())
		if err != nil {
			if isUsage(err) {
				return usagef("%v", err)
			}
			return err
		}
		for _, inc := range incs {
			all = append(all, databaseInconsistency{Database: key, Inconsistency: inc})
		}
		counts = append(counts, fmt.Sprintf("%s %d", key, len(incs)))
		return nil
	})
	if err != nil {
		return err
	}
	switch {
	case o.json:
		if err := writeJSON(m.Stdout, all); err != nil {
			return err
		}
	case len(all) == 0:
		fmt.Fprintf(m.Stdout, "consistent: no inconsistencies in %d databases\n", len(o.dbs))
	default:
		tw := newTable(m.Stdout, "DATABASE\tKIND\tQUEUE\tID\tPOSTGRES\tREDIS")
		for _, inc := range all {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", inc.Database, inc.Kind, inc.Queue, inc.ID, inc.Postgres, inc.Redis)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(all) > 0 {
		return fmt.Errorf("%d inconsistencies found (%s; run 'delayq reconcile --database-url URL --database-key KEY' on each to repair)",
			len(all), strings.Join(counts, ", "))
	}
	return nil
}
