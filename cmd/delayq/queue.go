package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/relay/reconcile"
)

const queueUsage = `Usage: delayq queue <action> [flags]

Actions:
  pause QUEUE    stop every worker claiming from QUEUE, from its next claim on
  resume QUEUE   let workers claim from QUEUE again (sleeping workers wake at once)
  list           every queue ever paused: paused or not, in Postgres and in Redis

Examples:
  delayq queue pause payment
  delayq queue resume payment
  delayq queue list --json

A pause is written to PostgreSQL (the table delayq_queues, the truth) and then to
Redis (dq:{queue}:ctl), which the claim script reads: once 'pause' returns, no
worker claims from the queue. Tasks keep their due times and run when the queue is
resumed; enqueues and the relay go on. The relay mirrors the flag from PostgreSQL
every few seconds, so a Redis that lost it gets it back.

Run 'delayq queue <action> --help' for the flags of each.
`

func runQueue(ctx context.Context, m *Main, args []string) error {
	if len(args) == 0 {
		return usagef("want an action: pause, resume or list (see --help)")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(m.Stdout, queueUsage)
		return errHelp
	case "pause":
		return runQueueSet(ctx, m, "pause", true, args[1:])
	case "resume":
		return runQueueSet(ctx, m, "resume", false, args[1:])
	case "list":
		return runQueueList(ctx, m, args[1:])
	}
	return usagef("unknown action %q: want pause, resume or list", args[0])
}

func runQueueSet(ctx context.Context, m *Main, action string, paused bool, args []string) error {
	var conn connFlags
	fs := newFlagSet(m, "queue "+action, "queue "+action+" [flags] QUEUE",
		"  delayq queue "+action+" payment\n")
	conn.register(fs, m, true, true)
	if err := parseArgs(fs, args, 1); err != nil {
		return err
	}
	queue := fs.Arg(0)
	if err := validate.Queue(queue); err != nil {
		return usagef("%v", err)
	}
	pool, dq, closeAll, err := openStores(ctx, &conn, reconcile.Options{Schema: conn.schema}, true)
	if err != nil {
		return err
	}
	defer closeAll()
	ob, err := newOutbox(conn.schema)
	if err != nil {
		return usagef("%v", err)
	}
	// Postgres first (the truth), then Redis, keyed by the version.
	var v int64
	if paused {
		v, err = ob.PauseQueue(ctx, pool, queue)
	} else {
		v, err = ob.ResumeQueue(ctx, pool, queue)
	}
	if err != nil {
		return err
	}
	if _, err := dq.SetPaused(ctx, queue, v, paused); err != nil {
		return fmt.Errorf("%s recorded in PostgreSQL, not yet in Redis (the relay mirrors it within seconds): %w", action, err)
	}
	state := "paused"
	if !paused {
		state = "resumed"
	}
	fmt.Fprintf(m.Stdout, "%s %s\n", queue, state)
	return nil
}

// queueRow is one line of queue list.
type queueRow struct {
	Queue       string `json:"queue"`
	Paused      bool   `json:"paused"`
	RedisPaused bool   `json:"redis_paused"`
	Version     int64  `json:"version"`
	UpdatedAt   string `json:"updated_at"`
}

func runQueueList(ctx context.Context, m *Main, args []string) error {
	var conn connFlags
	fs := newFlagSet(m, "queue list", "queue list [flags]",
		"  delayq queue list\n  delayq queue list --json\n\n"+
			"PAUSED is PostgreSQL's flag (the truth), REDIS what the claim script sees.\n")
	conn.register(fs, m, true, true)
	asJSON := fs.Bool("json", false, "print the list as JSON")
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	pool, dq, closeAll, err := openStores(ctx, &conn, reconcile.Options{Schema: conn.schema}, true)
	if err != nil {
		return err
	}
	defer closeAll()
	ob, err := newOutbox(conn.schema)
	if err != nil {
		return usagef("%v", err)
	}
	ctls, err := ob.QueueControls(ctx, pool)
	if err != nil {
		return err
	}
	rows := make([]queueRow, 0, len(ctls))
	for _, c := range ctls {
		rp, err := dq.Paused(ctx, c.Queue)
		if err != nil {
			return err
		}
		rows = append(rows, queueRow{Queue: c.Queue, Paused: c.Paused, RedisPaused: rp, Version: c.Version,
			UpdatedAt: c.UpdatedAt.UTC().Format("2006-01-02T15:04:05Z")})
	}
	if *asJSON {
		return writeJSON(m.Stdout, rows)
	}
	if len(rows) == 0 {
		fmt.Fprintln(m.Stdout, "no queue was ever paused")
		return nil
	}
	tw := tabwriter.NewWriter(m.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tPAUSED\tREDIS\tVERSION\tUPDATED")
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", r.Queue, yes(r.Paused), yes(r.RedisPaused), r.Version, r.UpdatedAt)
	}
	return tw.Flush()
}

// pausedQueues tells, for stats, whether each queue is paused as Postgres says:
// "yes" or "no"; "-" for every queue when the controls cannot be read (an outbox
// not migrated to 00004 yet).
func pausedQueues(ctx context.Context, pool *pgxpool.Pool, schema string) func(queue string) string {
	ob, err := newOutbox(schema)
	if err != nil {
		return func(string) string { return "-" }
	}
	ctls, err := ob.QueueControls(ctx, pool)
	if err != nil {
		return func(string) string { return "-" }
	}
	paused := map[string]bool{}
	for _, c := range ctls {
		paused[c.Queue] = c.Paused
	}
	return func(q string) string {
		if paused[q] {
			return "yes"
		}
		return "no"
	}
}
