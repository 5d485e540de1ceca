package main

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/dispatch"
)

const workersHelp = "  delayq workers           # the worker processes, then what each is running\n" +
	"  delayq workers --json    # the same as JSON\n\n" +
	"Every process running handlers (delayq.Client.Run, delayq worker) registers in\n" +
	"Redis and beats every lease/3; it leaves when it stops. Columns: STATUS is \"lost\"\n" +
	"when a process has not beaten for its lease (killed, or cut off from Redis); a\n" +
	"lost process stays listed ten minutes. UP: since its first beat; BEAT: since its\n" +
	"last; QUEUES: each queue with its concurrency; IN-FLIGHT: runs in flight at the\n" +
	"last beat. The second table lists those runs (at most 100 a process, the\n" +
	"longest first), FOR: since their claim. Times are by the Redis clock.\n"

func runWorkers(ctx context.Context, m *Main, args []string) error {
	var conn connFlags
	fs := newFlagSet(m, "workers", "workers [flags]", workersHelp)
	conn.register(fs, m, false, true)
	asJSON := fs.Bool("json", false, "print the workers as JSON")
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	rdb, err := conn.openRedis(ctx)
	if err != nil {
		return err
	}
	defer rdb.Close()
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: conn.namespace()})
	if err != nil {
		return usagef("%v", err)
	}
	ws, err := dq.Workers(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		if ws == nil {
			ws = []delayqtype.Worker{}
		}
		return writeJSON(m.Stdout, ws)
	}
	if len(ws) == 0 {
		fmt.Fprintln(m.Stdout, "no workers")
		return nil
	}
	tw := newTable(m.Stdout, "ID\tHOST\tPID\tVERSION\tSTATUS\tUP\tBEAT\tQUEUES\tIN-FLIGHT")
	runs := 0
	for _, w := range ws {
		status := "running"
		if w.Lost {
			status = "lost"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\n", w.ID, cut(w.Host, 40), w.PID, cut(w.Version, 30), status,
			age(w.ReadAt.Sub(w.Started)), age(w.ReadAt.Sub(w.LastBeat)), queueConcurrency(w.Queues), w.InFlight)
		runs += len(w.Running)
	}
	if err := tw.Flush(); err != nil || runs == 0 {
		return err
	}
	fmt.Fprintln(m.Stdout)
	tw = newTable(m.Stdout, "WORKER\tQUEUE\tID\tATTEMPT\tFOR")
	for _, w := range ws {
		for _, r := range w.Running {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", w.ID, r.Queue, cut(r.ID, 60), r.Attempt, age(w.ReadAt.Sub(r.ClaimedAt)))
		}
	}
	return tw.Flush()
}

// queueConcurrency writes queues and their concurrency as "emails:10,payment:4".
func queueConcurrency(qs map[string]int) string {
	names := make([]string, 0, len(qs))
	for q := range qs {
		names = append(names, q)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, q := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s:%d", q, qs[q])
	}
	return b.String()
}
