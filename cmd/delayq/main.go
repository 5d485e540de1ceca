// Command delayq is the one binary an operator uses: the relay sidecar, workers,
// reconcile, inspection, dead letters, migrations, the demo, a health check for
// container images, and its version.
//
// Exit codes: 0 success, 1 failure (including inconsistencies found by check),
// 2 usage error. Errors are printed as one line on standard error.
//
// Built as it is (go build ./cmd/delayq, the Dockerfile), the binary links no
// Docker client and no test code; `delayq dev` starts PostgreSQL and Redis from
// local binaries. Built with -tags delayqdev (make demo, make bench) it also has
// the benchmark workloads, and the demo starts throwaway PostgreSQL and Redis
// servers from local binaries when no URLs are given (where there are none, make
// starts Docker containers through the dev module and passes their URLs).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
)

func main() {
	// go-redis logs every failed dial and reconnect to stderr by itself; the
	// relay and workers report an outage once, on its state change, instead.
	// (Process-wide, so it is set here, once, and not by the commands.)
	redis.SetLogger(silentRedisLogger{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := NewMain(os.Stdout, os.Stderr, os.Getenv).Run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// silentRedisLogger drops go-redis's internal log lines.
type silentRedisLogger struct{}

func (silentRedisLogger) Printf(context.Context, string, ...any) {}

// devTag is the build tag of the development build: bench, and throwaway servers
// for demo and bench (bench.go, servers.go; their stand-ins are *_stub.go).
const devTag = "delayqdev"

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// Main holds what every subcommand gets from the process: its output streams and
// environment, so tests can run commands in-process.
type Main struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
}

// NewMain returns a Main writing to the given streams.
func NewMain(stdout, stderr io.Writer, getenv func(string) string) *Main {
	return &Main{Stdout: stdout, Stderr: stderr, Getenv: getenv}
}

// command is one subcommand: a summary for the command list and its runner.
type command struct {
	summary string
	run     func(ctx context.Context, m *Main, args []string) error
}

// commands lists the subcommands. Each lives in its own file.
func commands() map[string]command {
	return map[string]command{
		"migrate": {"apply, roll back or show the outbox schema migrations", runMigrate},
		"relay":   {"run the relay sidecar: outbox rows to Redis, lease reaper, retention, /metrics", runRelay},
		"worker":  {"run a shell command for each task of some queues (payload on stdin), /metrics", runWorker},
		"bench":   {benchSummary, runBench},
		"demo":    {"run the whole system end to end and report (on throwaway servers: make demo)", runDemo},
		"dev":     {"start local PostgreSQL and Redis for development and tests; print the variables to export", runDev},

		// For images and releases.
		"version":     {"print the module version, commit and Go version of this binary (also --version)", runVersion},
		"healthcheck": {"GET the admin server's /healthz (for a container HEALTHCHECK; no shell needed)", runHealthcheck},

		// Operator commands on both stores (relay/reconcile).
		"reconcile":  {"compare Postgres with Redis and rebuild Redis from Postgres (--dry-run to look only)", runReconcile},
		"check":      {"list every inconsistency between Postgres and Redis; exit 1 if any", runCheck},
		"stats":      {"per queue: outbox rows by state, Redis ready/due/active/dead, lags", runStats},
		"dead":       {"list, retry or purge dead tasks in both stores", runDead},
		"ui":         {"serve the operator's web dashboard on 127.0.0.1:8080 (--demo: watch a live demo workload)", runUI},
		"enqueue":    {"enqueue a task into the outbox from the command line", runEnqueue},
		"cancel":     {"cancel a pending or queued task", runCancel},
		"reschedule": {"move a pending or queued task to a new run time", runReschedule},
		"queue":      {"pause, resume, rate-limit or shard a queue; list the queues' controls", runQueue},
		"schedules":  {"list periodic tasks (relay --schedules): their last and next ticks", runSchedules},
	}
}

// usageError is a mistake in the command line: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// Run runs the subcommand named by args[0] and returns the exit code.
func (m *Main) Run(ctx context.Context, args []string) int {
	cmds := commands()
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		args = append([]string{"version"}, args[1:]...)
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		m.usage(cmds)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(m.Stderr, "delayq: unknown command %q (run 'delayq help' for the list)\n", args[0])
		return exitUsage
	}
	err := cmd.run(ctx, m, args[1:])
	var uerr *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errHelp):
		return exitOK
	case errors.As(err, &uerr):
		fmt.Fprintf(m.Stderr, "delayq %s: %s\n", args[0], oneLine(err.Error()))
		return exitUsage
	default:
		fmt.Fprintf(m.Stderr, "delayq %s: %s%s\n", args[0], oneLine(err.Error()), migrationHint(err))
		return exitFailure
	}
}

// migrationHint is the fix for an error that says one of the outbox's tables is
// missing: the migrations have not run on this database (or schema).
func migrationHint(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" && strings.Contains(pgErr.Message, "delayq_") { // undefined_table
		return " (run the migrations: delayq migrate up)"
	}
	return ""
}

func (m *Main) usage(cmds map[string]command) {
	names := make([]string, 0, len(cmds))
	for name := range cmds {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("delayq: delayed tasks enqueued in PostgreSQL transactions, timed and dispatched by Redis.\n\n")
	b.WriteString("Usage: delayq <command> [flags]\n\nCommands:\n")
	for _, name := range names {
		fmt.Fprintf(&b, "  %-11s %s\n", name, cmds[name].summary)
	}
	b.WriteString("\nEnvironment: DATABASE_URL, REDIS_URL (flags override).\n")
	b.WriteString("Exit codes: 0 ok, 1 failure, 2 usage error.\n")
	b.WriteString("Run 'delayq <command> --help' for a command's flags and examples.\n")
	fmt.Fprint(m.Stdout, b.String())
}

// oneLine folds a multi-line error into one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
