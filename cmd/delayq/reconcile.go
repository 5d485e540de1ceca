package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

func runReconcile(ctx context.Context, m *Main, args []string) error {
	var conn connFlags
	var queues queueList
	fs := newFlagSet(m, "reconcile", "reconcile [flags]",
		"  delayq reconcile --dry-run              # what would be repaired; changes nothing\n"+
			"  delayq reconcile                        # rebuild Redis from Postgres, every queue\n"+
			"  delayq reconcile --queue payment --json # one queue, the report as JSON\n\n"+
			"Postgres is the truth. Queued rows missing from Redis are enqueued again (attempts\n"+
			"and version kept); Redis tasks whose row is finished, dead or gone are removed;\n"+
			"a task dead in Redis but queued in Postgres runs again (after --grace); a task\n"+
			"whose hash and ZSETs disagree is rebuilt. Pending rows are left to the relay,\n"+
			"expired leases to the reaper. Safe while relays and workers run.\n")
	conn.register(fs, m, true, true)
	fs.Var(&queues, "queue", "only this queue (repeat, or comma-separated; default: every queue)")
	dryRun := fs.Bool("dry-run", false, "report what would be repaired without changing anything")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	batch := fs.Int("batch", 500, "rows or Redis ids per step, 1..1000")
	grace := fs.Duration("grace", time.Minute, "leave a task dead in Redis but queued in Postgres alone while its death is younger than this (0: no grace)")
	samples := fs.Int("samples", 5, "task ids shown per kind")
	deep := fs.Bool("deep", false, "also SCAN the whole keyspace for task hashes outside every ZSET (costs a pass over every key)")
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	if *batch < 1 || *batch > 1000 {
		return usagef("--batch %d: 1..1000", *batch)
	}
	opts := reconcile.Options{Queues: queues.list, Schema: conn.schema, DryRun: *dryRun,
		BatchSize: *batch, Grace: *grace, Samples: *samples, Deep: *deep}
	if *grace == 0 {
		opts.Grace = -1
	}
	if *samples == 0 {
		opts.Samples = -1
	}
	pool, dq, closeAll, err := openStores(ctx, &conn, opts, true)
	if err != nil {
		return err
	}
	defer closeAll()
	if isTerminal(m.Stderr) {
		p := newProgressLine(m.Stderr)
		defer p.clear()
		opts.Progress = p.show
	}
	rep, err := reconcile.Reconcile(ctx, pool, dq, opts)
	if err != nil {
		return err
	}
	if *asJSON {
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
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		if rep.DryRun {
			fmt.Fprintln(tw, "KIND\tFOUND\tLEFT ALONE\tMEANING\tSAMPLES")
		} else {
			fmt.Fprintln(tw, "KIND\tFOUND\tREPAIRED\tSKIPPED\tMEANING\tSAMPLES")
		}
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

// plural writes "1 queue", "2 queues".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
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

// The helpers below are shared by the operator commands (reconcile, check,
// stats, dead, enqueue, cancel, reschedule).

// queueList is a --queue flag that may repeat and take comma-separated names.
type queueList struct{ list []string }

func (q *queueList) String() string { return strings.Join(q.list, ",") }

func (q *queueList) Set(s string) error {
	for _, name := range strings.Split(s, ",") {
		if err := validate.Queue(name); err != nil {
			return err
		}
		q.list = append(q.list, name)
	}
	return nil
}

// parseArgs parses flags and positional arguments in any order and checks that
// there are exactly want positional ones (-1: any number).
func parseArgs(fs *flagSet, args []string, want int) error {
	var pos []string
	for i, a := range args {
		if a == "--" { // everything after is positional, as usual
			pos = append(pos, args[i+1:]...)
			args = args[:i]
			break
		}
	}
	var lead []string
	for {
		if err := parse(fs, args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		lead = append(lead, fs.Arg(0))
		args = fs.Args()[1:]
	}
	pos = append(lead, pos...)
	if want >= 0 && len(pos) != want {
		if len(pos) > want {
			return usagef("unexpected argument %q (see --help)", pos[want])
		}
		return usagef("missing argument (see --help)")
	}
	// Keep the positional arguments where Args finds them.
	_ = fs.FlagSet.Parse(append([]string{"--"}, pos...))
	return nil
}

// openStores checks the options and the URLs, then connects to Postgres and,
// with needRedis, to Redis. closeAll closes what was opened. Every mistake in the
// input is found before anything connects.
func openStores(ctx context.Context, conn *connFlags, opts reconcile.Options, needRedis bool) (
	pool *pgxpool.Pool, dq *dispatch.Client, closeAll func(), err error,
) {
	if err := opts.Validate(); err != nil {
		return nil, nil, nil, usagef("%s", strings.TrimPrefix(err.Error(), reconcile.ErrInvalidOptions.Error()+": "))
	}
	if conn.databaseURL == "" {
		return nil, nil, nil, usagef("no PostgreSQL URL: set DATABASE_URL or --database-url")
	}
	if _, err := parsePostgresURL(conn.databaseURL); err != nil {
		return nil, nil, nil, err
	}
	if needRedis {
		if err := checkRedisFlags(conn); err != nil {
			return nil, nil, nil, err
		}
	}
	pool, err = conn.openPostgres(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	if !needRedis {
		return pool, nil, pool.Close, nil
	}
	rdb, dq, err := openDelayq(ctx, conn)
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	return pool, dq, func() { pool.Close(); _ = rdb.Close() }, nil
}

// checkRedisFlags checks the Redis URL and the key prefix without connecting.
func checkRedisFlags(conn *connFlags) error {
	if err := validate.Prefix(conn.prefix); err != nil {
		return usagef("--prefix: %v", err)
	}
	if conn.redisURL == "" {
		return usagef("no Redis URL: set REDIS_URL or --redis-url")
	}
	if _, _, _, err := parseRedisURL(conn.redisURL); err != nil {
		return err
	}
	return nil
}

// openDelayq connects to Redis and returns a delayq client on it. go-redis logs
// every failed dial on its own logger (standard error) before it returns the
// error, so a plain TCP dial first turns an unreachable server into one error line.
func openDelayq(ctx context.Context, conn *connFlags) (redis.UniversalClient, *dispatch.Client, error) {
	if _, network, addr, err := parseRedisURL(conn.redisURL); err == nil {
		d := net.Dialer{Timeout: 10 * time.Second}
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			//lint:ignore ST1005 a name: the error starts with the server it is about, as PostgreSQL's do
			return nil, nil, fmt.Errorf("Redis %s unreachable: %w", redactURL(conn.redisURL), err)
		}
		_ = c.Close()
	}
	rdb, err := conn.openRedis(ctx)
	if err != nil {
		return nil, nil, err
	}
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: conn.prefix})
	if err != nil {
		_ = rdb.Close()
		return nil, nil, usagef("%v", err)
	}
	return rdb, dq, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// isUsage reports whether err is a mistake in the input rather than a failure.
func isUsage(err error) bool {
	for _, s := range []error{outbox.ErrInvalidQueue, outbox.ErrInvalidTaskID, outbox.ErrInvalidDelay,
		outbox.ErrInvalidRunAt, outbox.ErrPayloadTooLarge, outbox.ErrInvalidMaxAttempts, outbox.ErrInvalidStartBy, reconcile.ErrInvalidOptions} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

var _ flag.Value = (*queueList)(nil)
