package main

import (
	"context"
	"fmt"
	"time"

	"github.com/delayq/delayq/delayqtype"
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

// deadOptions is what 'delayq dead list|retry|purge' was asked.
type deadOptions struct {
	scanFlags
	limit int  // list
	json  bool // list
	all   bool // retry
	yes   bool // purge
	id    string
}

// queueTask is the one task an action names: --queue (one) and the id.
func (o *deadOptions) queueTask() (queue, id string) { return o.queues.list[0], o.id }

// validateID takes the task id among args (none: every dead task) and checks
// it; an id needs one --queue.
func (o *deadOptions) validateID(action string, args []string) error {
	switch {
	case len(args) > 1:
		return usagef("at most one task id")
	case len(args) == 0:
		return nil
	case len(o.queues.list) != 1:
		return usagef("%s <id> needs --queue (one queue)", action)
	}
	o.id = args[0]
	if err := validate.TaskID(o.id); err != nil {
		return usagef("%v", err)
	}
	return nil
}

func (o *deadOptions) parseList(m *Main, args []string) error {
	fs := newFlagSet(m, "dead list", "dead list [flags]",
		"  delayq dead list                        # the 100 most recent deaths, every queue\n"+
			"  delayq dead list --queue payment --json # one queue, as JSON\n")
	o.register(fs, m, false, "only this queue (repeat, or comma-separated; default: every queue)")
	fs.IntVar(&o.limit, "limit", 100, "show at most this many")
	fs.BoolVar(&o.json, "json", false, "print the list as JSON")
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	if o.limit < 1 {
		return usagef("--limit %d: at least 1", o.limit)
	}
	return o.validate(o.options())
}

// runDeadList calls the client's DeadTasks.
func runDeadList(ctx context.Context, m *Main, args []string) error {
	var o deadOptions
	if err := o.parseList(m, args); err != nil {
		return err
	}
	s, err := o.conn.openStores(ctx, false)
	if err != nil {
		return err
	}
	defer s.close()
	dead, err := s.client.DeadTasks(ctx, o.limit, o.queues.list...)
	if err != nil {
		return err
	}
	if o.json {
		if dead == nil {
			dead = []delayqtype.DeadTask{}
		}
		return writeJSON(m.Stdout, dead)
	}
	if len(dead) == 0 {
		fmt.Fprintln(m.Stdout, "no dead tasks")
		return nil
	}
	tw := newTable(m.Stdout, "QUEUE\tID\tATTEMPTS\tDIED AT\tLAST ERROR")
	for _, d := range dead {
		died := "-"
		if !d.DiedAt.IsZero() {
			died = d.DiedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s\t%s\n", d.Queue, d.ID, d.Attempts, d.MaxAttempts, died, oneLine(cut(d.LastError, 120)))
	}
	return tw.Flush()
}

func (o *deadOptions) parseRetry(m *Main, args []string) error {
	fs := newFlagSet(m, "dead retry", "dead retry --queue q <id> | dead retry --all [--queue q]",
		"  delayq dead retry --queue payment order-1001   # run it again now, attempts reset\n"+
			"  delayq dead retry --all --queue payment        # every dead task of a queue\n")
	o.register(fs, m, true, "the task's queue (with --all: only these queues)")
	fs.BoolVar(&o.all, "all", false, "retry every dead task")
	o.registerBatch(fs, "tasks per transaction with --all, 1..1000")
	if err := parseArgs(fs, args, -1); err != nil {
		return err
	}
	if err := o.validate(o.options()); err != nil {
		return err
	}
	switch {
	case o.all && fs.NArg() > 0:
		return usagef("give --all or an id, not both")
	case !o.all && fs.NArg() != 1:
		return usagef("want one task id, or --all (see --help)")
	}
	return o.validateID("retry", fs.Args())
}

// runDeadRetry calls the client's RetryDead for one task, and internal/reconcile
// for --all (the client has no RetryAllDead).
func runDeadRetry(ctx context.Context, m *Main, args []string) error {
	var o deadOptions
	if err := o.parseRetry(m, args); err != nil {
		return err
	}
	s, err := o.conn.openStores(ctx, false)
	if err != nil {
		return err
	}
	defer s.close()
	if o.all {
		n, err := reconcile.RetryAllDead(ctx, s.pool, o.options())
		if err != nil {
			return err
		}
		fmt.Fprintf(m.Stdout, "retried %d dead tasks: due now as new versions, attempts reset; the relay moves them\n", n)
		return nil
	}
	q, id := o.queueTask()
	if err := s.client.RetryDead(ctx, q, id); err != nil {
		return err
	}
	fmt.Fprintf(m.Stdout, "retried %s/%s: due now as a new version, attempts reset; the relay moves it\n", q, id)
	return nil
}

func (o *deadOptions) parsePurge(m *Main, args []string) error {
	fs := newFlagSet(m, "dead purge", "dead purge --yes [--queue q] [<id>]",
		"  delayq dead purge --yes                        # every dead task, every queue\n"+
			"  delayq dead purge --yes --queue payment        # one queue\n"+
			"  delayq dead purge --yes --queue payment order-1001\n\n"+
			"Deletes the outbox rows and the Redis tasks for good: the ids become free, and\n"+
			"an enqueue of the same id is a new task.\n")
	o.register(fs, m, true, "only this queue (needed with an id)")
	fs.BoolVar(&o.yes, "yes", false, "confirm: delete for good")
	o.registerBatch(fs, "tasks per transaction, 1..1000")
	if err := parseArgs(fs, args, -1); err != nil {
		return err
	}
	if err := o.validateID("purge", fs.Args()); err != nil {
		return err
	}
	if !o.yes {
		return usagef("purge deletes dead tasks from both stores for good: add --yes")
	}
	return o.validate(o.options())
}

// runDeadPurge calls internal/reconcile: the client's PurgeDead has no batch
// and no single task.
func runDeadPurge(ctx context.Context, m *Main, args []string) error {
	var o deadOptions
	if err := o.parsePurge(m, args); err != nil {
		return err
	}
	s, err := o.conn.openStores(ctx, true)
	if err != nil {
		return err
	}
	defer s.close()
	if o.id != "" {
		q, id := o.queueTask()
		if err := reconcile.PurgeDeadTask(ctx, s.pool, s.dq, o.options(), q, id); err != nil {
			return err
		}
		fmt.Fprintf(m.Stdout, "purged %s/%s\n", q, id)
		return nil
	}
	n, err := reconcile.PurgeDead(ctx, s.pool, s.dq, o.options())
	if err != nil {
		return err
	}
	fmt.Fprintf(m.Stdout, "purged %d dead tasks\n", n)
	return nil
}
