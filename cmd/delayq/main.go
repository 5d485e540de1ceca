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
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/notmigrated"
	"github.com/redis/go-redis/v9"
)

func main() {
	m := NewMain(os.Stdout, os.Stderr, os.Getenv)
	// go-redis logs every failed dial to stderr by itself, several a second
	// while Redis is down; routed instead to the log of the commands that run
	// (relay, worker: a failed dial once per outage, the rest at DEBUG, and
	// each part's own line when it loses Redis and when it is back), and
	// dropped by the one-shot commands, whose error is their one line.
	// (Process-wide, so it is set here, once, and not by the commands.)
	redis.SetLogger(delayq.RedisLogger(slog.New(&m.goRedis)))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := m.Run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// lateHandler hands log records to the handler set last (the running
// command's log), and drops them until one is set.
type lateHandler struct{ to atomic.Pointer[slog.Handler] }

func (h *lateHandler) set(to slog.Handler) { h.to.Store(&to) }

func (h *lateHandler) get() slog.Handler {
	if p := h.to.Load(); p != nil {
		return *p
	}
	return slog.DiscardHandler
}

func (h *lateHandler) Enabled(ctx context.Context, l slog.Level) bool  { return h.get().Enabled(ctx, l) }
func (h *lateHandler) Handle(ctx context.Context, r slog.Record) error { return h.get().Handle(ctx, r) }
func (h *lateHandler) WithAttrs(as []slog.Attr) slog.Handler           { return h.get().WithAttrs(as) }
func (h *lateHandler) WithGroup(name string) slog.Handler              { return h.get().WithGroup(name) }

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
	// goRedis takes go-redis's lines (main routes them here) to the log of
	// the command that makes one (newLogger).
	goRedis lateHandler
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
		"schedules":  {"list periodic tasks (relay --schedules, or declared in Go): their last and next ticks; pause, resume, run one now", runSchedules},
		"task":       {"show one task's row and its attempt history (errors, a panic's stack)", runTask},
		"workers":    {"list the worker processes (host, pid, version, queues) and the tasks each is running", runWorkers},
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
	// The line names the action of the commands that have them: "delayq dead
	// retry: ...".
	name := args[0]
	if (name == "dead" || name == "queue" || name == "schedules") && len(args) > 1 && !strings.HasPrefix(args[1], "-") {
		name += " " + args[1]
	}
	var uerr *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errHelp):
		return exitOK
	case errors.As(err, &uerr):
		fmt.Fprintf(m.Stderr, "delayq %s: %s\n", name, oneLine(err.Error()))
		return exitUsage
	default:
		// A missing table reads the same from every command, ending with the fix.
		fmt.Fprintf(m.Stderr, "delayq %s: %s\n", name, oneLine(notmigrated.Classify(err).Error()))
		return exitFailure
	}
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
