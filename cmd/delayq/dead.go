package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/validate"
)

const deadUsage = `Usage: delayq dead list|retry|purge [flags]

Dead tasks used their attempts (or were killed) and wait for a person. Postgres is
the record: the outbox row is dead, with its attempts and last error.

  list                         id, attempts, last error and time of death, newest first
  retry --queue q <id>         run it again now, attempts reset (see below)
  retry --all [--queue q]      the same for every dead task (of queue q)
  purge --yes [--queue q] [<id>]
                               delete dead tasks from Postgres and Redis for good

Retry writes Postgres alone: the outbox row becomes pending as a new version, due now,
with attempt 0 (its last error kept until the next run); the relay moves it at once
(it is notified) and replaces the dead task in Redis (or finds none, after a Redis
loss). Purge deletes the rows first, then what Redis holds of them.

Examples:
  delayq dead list --queue payment --limit 20
  delayq dead retry --queue payment order-1001
  delayq dead retry --all --queue payment
  delayq dead purge --yes --queue payment

Run 'delayq dead <action> --help' for the flags of one action.
Environment: DATABASE_URL, REDIS_URL (flags override them).
Exit codes: 0 ok, 1 failure, 2 usage error.
`

func runDead(ctx context.Context, m *Main, args []string) error {
	if len(args) == 0 {
		return usagef("want an action: list, retry or purge (see --help)")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(m.Stdout, deadUsage)
		return errHelp
	case "list":
		return runDeadList(ctx, m, args[1:])
	case "retry":
		return runDeadRetry(ctx, m, args[1:])
	case "purge":
		return runDeadPurge(ctx, m, args[1:])
	}
	return usagef("unknown action %q: want list, retry or purge", args[0])
}

func runDeadList(ctx context.Context, m *Main, args []string) error {
	var conn connFlags
	var queues queueList
	fs := newFlagSet(m, "dead list", "dead list [flags]",
		"  delayq dead list                        # the 100 most recent deaths, every queue\n"+
			"  delayq dead list --queue payment --json # one queue, as JSON\n")
	conn.register(fs, m, true, false)
	fs.Var(&queues, "queue", "only this queue (repeat, or comma-separated; default: every queue)")
	limit := fs.Int("limit", 100, "show at most this many")
	asJSON := fs.Bool("json", false, "print the list as JSON")
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	if *limit < 1 {
		return usagef("--limit %d: at least 1", *limit)
	}
	opts := reconcile.Options{Queues: queues.list, Schema: conn.schema}
	pool, _, closeAll, err := openStores(ctx, &conn, opts, false)
	if err != nil {
		return err
	}
	defer closeAll()
	dead, err := reconcile.ListDead(ctx, pool, opts, *limit)
	if err != nil {
		return err
	}
	if *asJSON {
		if dead == nil {
			dead = []reconcile.DeadTask{}
		}
		return writeJSON(m.Stdout, dead)
	}
	if len(dead) == 0 {
		fmt.Fprintln(m.Stdout, "no dead tasks")
		return nil
	}
	tw := tabwriter.NewWriter(m.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tID\tATTEMPTS\tDIED AT\tLAST ERROR")
	for _, d := range dead {
		died := "-"
		if !d.DiedAt.IsZero() {
			died = d.DiedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s\t%s\n", d.Queue, d.ID, d.Attempts, d.MaxAttempts, died, oneLine(cut(d.LastError, 120)))
	}
	return tw.Flush()
}

func runDeadRetry(ctx context.Context, m *Main, args []string) error {
	var conn connFlags
	var queues queueList
	fs := newFlagSet(m, "dead retry", "dead retry --queue q <id> | dead retry --all [--queue q]",
		"  delayq dead retry --queue payment order-1001   # run it again now, attempts reset\n"+
			"  delayq dead retry --all --queue payment        # every dead task of a queue\n")
	conn.register(fs, m, true, true)
	fs.Var(&queues, "queue", "the task's queue (with --all: only these queues)")
	all := fs.Bool("all", false, "retry every dead task")
	batch := fs.Int("batch", 500, "tasks per transaction with --all, 1..1000")
	if err := parseArgs(fs, args, -1); err != nil {
		return err
	}
	if *batch < 1 || *batch > 1000 {
		return usagef("--batch %d: 1..1000", *batch)
	}
	opts := reconcile.Options{Queues: queues.list, Schema: conn.schema, BatchSize: *batch}
	switch {
	case *all && fs.NArg() > 0:
		return usagef("give --all or an id, not both")
	case !*all && fs.NArg() != 1:
		return usagef("want one task id, or --all (see --help)")
	case !*all && len(queues.list) != 1:
		return usagef("retry <id> needs --queue (one queue)")
	case !*all && validate.TaskID(fs.Arg(0)) != nil:
		return usagef("%v", validate.TaskID(fs.Arg(0)))
	}
	pool, _, closeAll, err := openStores(ctx, &conn, opts, false)
	if err != nil {
		return err
	}
	defer closeAll()
	if *all {
		n, err := reconcile.RetryAllDead(ctx, pool, opts)
		if err != nil {
			return err
		}
		fmt.Fprintf(m.Stdout, "retried %d dead tasks: due now as new versions, attempts reset; the relay moves them\n", n)
		return nil
	}
	q, id := queues.list[0], fs.Arg(0)
	if err := reconcile.RetryDead(ctx, pool, opts, q, id); err != nil {
		return err
	}
	fmt.Fprintf(m.Stdout, "retried %s/%s: due now as a new version, attempts reset; the relay moves it\n", q, id)
	return nil
}

func runDeadPurge(ctx context.Context, m *Main, args []string) error {
	var conn connFlags
	var queues queueList
	fs := newFlagSet(m, "dead purge", "dead purge --yes [--queue q] [<id>]",
		"  delayq dead purge --yes                        # every dead task, every queue\n"+
			"  delayq dead purge --yes --queue payment        # one queue\n"+
			"  delayq dead purge --yes --queue payment order-1001\n\n"+
			"Deletes the outbox rows and the Redis tasks for good: the ids become free, and\n"+
			"an enqueue of the same id is a new task.\n")
	conn.register(fs, m, true, true)
	fs.Var(&queues, "queue", "only this queue (needed with an id)")
	yes := fs.Bool("yes", false, "confirm: delete for good")
	batch := fs.Int("batch", 500, "tasks per transaction, 1..1000")
	if err := parseArgs(fs, args, -1); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 1:
		return usagef("at most one task id")
	case fs.NArg() == 1 && len(queues.list) != 1:
		return usagef("purge <id> needs --queue (one queue)")
	case fs.NArg() == 1 && validate.TaskID(fs.Arg(0)) != nil:
		return usagef("%v", validate.TaskID(fs.Arg(0)))
	case !*yes:
		return usagef("purge deletes dead tasks from both stores for good: add --yes")
	}
	if *batch < 1 || *batch > 1000 {
		return usagef("--batch %d: 1..1000", *batch)
	}
	opts := reconcile.Options{Queues: queues.list, Schema: conn.schema, BatchSize: *batch}
	pool, dq, closeAll, err := openStores(ctx, &conn, opts, true)
	if err != nil {
		return err
	}
	defer closeAll()
	if fs.NArg() == 1 {
		q, id := queues.list[0], fs.Arg(0)
		if err := reconcile.PurgeDeadTask(ctx, pool, dq, opts, q, id); err != nil {
			return err
		}
		fmt.Fprintf(m.Stdout, "purged %s/%s\n", q, id)
		return nil
	}
	n, err := reconcile.PurgeDead(ctx, pool, dq, opts)
	if err != nil {
		return err
	}
	fmt.Fprintf(m.Stdout, "purged %d dead tasks\n", n)
	return nil
}

// cut shortens s to at most n bytes for a table cell.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
