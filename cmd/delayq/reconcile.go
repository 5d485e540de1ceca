package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/delayq/delayq/internal/reconcile"
)

// reconcileOptions is what 'delayq reconcile' was asked.
type reconcileOptions struct {
	scanFlags
	dryRun, json, deep bool
	grace              time.Duration
	samples            int
}

const reconcileHelp = "  delayq reconcile --dry-run              # what would be repaired; changes nothing\n" +
	"  delayq reconcile                        # rebuild Redis from Postgres, every queue\n" +
	"  delayq reconcile --queue payment --json # one queue, the report as JSON\n\n" +
	"Postgres is the truth. Queued rows missing from Redis are enqueued again (attempts\n" +
	"and version kept); Redis tasks whose row is finished, dead or gone are removed;\n" +
	"a task dead in Redis but queued in Postgres runs again (after --grace); a task\n" +
	"whose hash and ZSETs disagree is rebuilt. Pending rows are left to the relay,\n" +
	"expired leases to the reaper. Safe while relays and workers run.\n"

func (o *reconcileOptions) parse(m *Main, args []string) error {
	fs := newFlagSet(m, "reconcile", "reconcile [flags]", reconcileHelp)
	o.register(fs, m, true, "only this queue (repeat, or comma-separated; default: every queue)")
	fs.BoolVar(&o.dryRun, "dry-run", false, "report what would be repaired without changing anything")
	fs.BoolVar(&o.json, "json", false, "print the report as JSON")
	o.registerBatch(fs, "rows or Redis ids per step, 1..1000")
	fs.DurationVar(&o.grace, "grace", time.Minute, "leave a task dead in Redis but queued in Postgres alone while its death is younger than this (0: no grace)")
	fs.IntVar(&o.samples, "samples", 5, "task ids shown per kind")
	fs.BoolVar(&o.deep, "deep", false, "also SCAN the whole keyspace for task hashes outside every ZSET (costs a pass over every key)")
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	return o.validate(o.options())
}

// options maps the flags onto the library's: a flag's 0 ("none") is its -1.
func (o *reconcileOptions) options() reconcile.Options {
	opts := o.scanFlags.options()
	opts.DryRun, opts.Deep, opts.Grace, opts.Samples = o.dryRun, o.deep, o.grace, o.samples
	if o.grace == 0 {
		opts.Grace = -1
	}
	if o.samples == 0 {
		opts.Samples = -1
	}
	return opts
}

// runReconcile calls internal/reconcile: the client's Reconcile has no dry
// run, batch, grace, samples, deep scan or progress.
func runReconcile(ctx context.Context, m *Main, args []string) error {
	var o reconcileOptions
	if err := o.parse(m, args); err != nil {
		return err
	}
	s, err := o.conn.openStores(ctx, true)
	if err != nil {
		return err
	}
	defer s.close()
	opts := o.options()
	if isTerminal(m.Stderr) {
		p := newProgressLine(m.Stderr)
		defer p.clear()
		opts.Progress = p.show
	}
	rep, err := reconcile.Reconcile(ctx, s.pool, s.dq, opts)
	if err != nil {
		return err
	}
	if o.json {
		return writeJSON(m.Stdout, rep)
	}
	return writeReport(m.Stdout, rep)
}

// writeReport prints a report for people.
func writeReport(w io.Writer, rep reconcile.Report) error {
	what := "reconcile"
	if rep.DryRun {
		what = "reconcile (dry run: nothing changed)"
	}
	fmt.Fprintf(w, "%s: %s, %s, %s, %v\n", what, plural(len(rep.Queues), "queue"), plural(rep.Rows, "outbox row"),
		plural(rep.RedisOnly, "Redis-only id"), rep.Duration.Round(time.Millisecond))
	if rep.Found == 0 {
		fmt.Fprintln(w, "no inconsistencies")
	} else {
		header := "KIND\tFOUND\tREPAIRED\tSKIPPED\tMEANING\tSAMPLES"
		if rep.DryRun {
			header = "KIND\tFOUND\tLEFT ALONE\tMEANING\tSAMPLES"
		}
		tw := newTable(w, header)
		for _, k := range reconcile.AllKinds() {
			b := rep.Kinds[k]
			if b == nil || b.Found == 0 {
				continue
			}
			if rep.DryRun {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", k, b.Found, b.Skipped, k.Describe(), strings.Join(b.Samples, " "))
			} else {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\n", k, b.Found, b.Repaired, b.Skipped, k.Describe(), strings.Join(b.Samples, " "))
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if rep.DryRun {
			fmt.Fprintf(w, "total: %d found, %d would be repaired\n", rep.Found, rep.Found-rep.Skipped)
		} else {
			fmt.Fprintf(w, "total: %d found, %d repaired, %d skipped (run again to retry them)\n", rep.Found, rep.Repaired, rep.Skipped)
		}
	}
	if rep.ExpiredLeases.Found > 0 {
		fmt.Fprintf(w, "expired leases: %d, left to the reaper (%s)\n", rep.ExpiredLeases.Found, strings.Join(rep.ExpiredLeases.Samples, " "))
	}
	return nil
}

// progressLine rewrites one line of a terminal, at most every 200ms.
type progressLine struct {
	w    io.Writer
	last time.Time
	used bool
}

func newProgressLine(w io.Writer) *progressLine { return &progressLine{w: w} }

func (p *progressLine) show(pr reconcile.Progress) {
	if time.Since(p.last) < 200*time.Millisecond {
		return
	}
	p.last, p.used = time.Now(), true
	of := ""
	if pr.Total > 0 {
		of = fmt.Sprintf("/%d", pr.Total)
	}
	unit := "rows"
	if pr.Phase == "redis" {
		unit = "Redis ids"
	}
	fmt.Fprintf(p.w, "\r\033[Kqueue %d/%d %s: %s %d%s %s, %d found",
		pr.QueueIndex, pr.Queues, pr.Queue, pr.Phase, pr.Done, of, unit, pr.Found)
}

func (p *progressLine) clear() {
	if p.used {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
