package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
)

// DefaultWorkerAddr is the worker command's admin address: the relay's port + 1,
// so both can run on one host with their defaults.
const DefaultWorkerAddr = "127.0.0.1:9091"

// execKillDelay is how long a command gets after SIGTERM before it is killed.
const execKillDelay = 10 * time.Second

// errorTailBytes is how much of a failed command's output goes into the task's
// last error (the end of it, where the reason usually is).
const errorTailBytes = 300

// workerOptions is what 'delayq worker' was asked: the flags, and the
// library's configs built from them.
type workerOptions struct {
	conn connFlags
	sidecarFlags
	queueSpec, command, weights    string
	concurrency, maxAttempts, dead int
	lease, heartbeat, shutdown     time.Duration
	backoffBase, backoffMax        time.Duration
	clearPayload, strict           bool
	transactional                  bool

	queues []string
	worker delayq.WorkerConfig
	queue  delayq.QueueConfig
	group  *delayq.PriorityGroup // nil without --weights
}

func (o *workerOptions) parse(m *Main, args []string) error {
	fs := newFlagSet(m, "worker", "worker --queue NAME[,NAME...] --exec COMMAND [flags]",
		"  delayq worker --queue mail --exec 'sendmail -t'              # payload on stdin\n"+
			"  delayq worker --queue hooks --exec './deliver.sh' --concurrency 50 --dead-exit-code 65\n"+
			"\n"+
			"Runs COMMAND with /bin/sh -c once per task: the payload on standard input, and in\n"+
			"the environment DELAYQ_QUEUE, DELAYQ_TASK_ID, DELAYQ_IDEMPOTENCY_KEY (queue/id),\n"+
			"DELAYQ_VERSION, DELAYQ_ATTEMPT, DELAYQ_MAX_ATTEMPTS, DELAYQ_DUE (RFC 3339) and\n"+
			"DELAYQ_RETRY_AFTER_FILE. Exit status 0: the task is done. Any other: it failed and\n"+
			"is retried after the backoff (or after the delay the command wrote to\n"+
			"$DELAYQ_RETRY_AFTER_FILE: seconds or a duration such as 1m30s), or is dead after\n"+
			"its last attempt (or at once with --dead-exit-code); the end of its output is\n"+
			"kept as the task's last error. A command may run more than once for a task\n"+
			"(at-least-once): pass DELAYQ_IDEMPOTENCY_KEY on to the systems it calls. When\n"+
			"the lease is lost or the shutdown timeout passes, the command gets SIGTERM, then\n"+
			"SIGKILL after 10s.\n"+
			"\n"+
			"  delayq worker --queue orders --exec 'python3 worker.py' --transactional\n"+
			"\n"+
			"With --transactional the command's own PostgreSQL writes happen exactly once: it\n"+
			"gets DELAYQ_DATABASE_URL and DELAYQ_SCHEMA too, and calls\n"+
			"delayq_complete($DELAYQ_QUEUE, $DELAYQ_TASK_ID, $DELAYQ_VERSION) in the\n"+
			"transaction of its writes, which commits them only if this run's version is\n"+
			"still to do. Exit status 0 without that completion retries the task.\n"+
			"docs/worker-protocol.md has the whole protocol.\n"+
			"\n"+
			"  delayq worker --queue critical,default,low --weights critical=6,default=3,low=1 --exec ./run.sh\n"+
			"\n"+
			"With --weights the queues share --concurrency slots: free slots go to the queues\n"+
			"with tasks due in proportion to their weights (6:3:1 above: 60 %, 30 %, 10 % of\n"+
			"the starts while each has a backlog), or with --strict to the highest weight\n"+
			"first, a lower queue only while every higher one has nothing due.\n")
	o.conn.register(fs, m, true, true)
	fs.StringVar(&o.queueSpec, "queue", "", "comma-separated queues to work on (required)")
	fs.StringVar(&o.command, "exec", "", "shell command run for each task (required)")
	fs.IntVar(&o.concurrency, "concurrency", 10, "commands running at once, per queue (1..1000)")
	fs.DurationVar(&o.lease, "lease", 5*time.Second, "lease of a claimed task; heartbeats renew it while the command runs")
	fs.DurationVar(&o.heartbeat, "heartbeat", 0, "lease renewal interval (default lease/3)")
	fs.DurationVar(&o.shutdown, "shutdown-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long running commands may finish before they are stopped and their tasks handed back")
	fs.IntVar(&o.maxAttempts, "max-attempts", 0, "cap on the runs of a task (default: the task's own, set at enqueue)")
	fs.DurationVar(&o.backoffBase, "backoff-base", time.Second, "retry delay after the first failure; doubles with each attempt, jittered into [d/2, d]")
	fs.DurationVar(&o.backoffMax, "backoff-max", time.Hour, "longest retry delay")
	fs.IntVar(&o.dead, "dead-exit-code", 0, "exit status (1..255) that makes the task dead at once, without retry (default: none)")
	fs.BoolVar(&o.clearPayload, "clear-payload", false, "empty the payload in PostgreSQL when a task is done")
	fs.BoolVar(&o.transactional, "transactional", false, "the command completes each task itself, with delayq_complete in the transaction of its own writes (given DELAYQ_DATABASE_URL)")
	o.sidecarFlags.register(fs, DefaultWorkerAddr, "address of /metrics, /healthz and /readyz (empty for none)")
	fs.StringVar(&o.weights, "weights", "", "NAME=WEIGHT,... for every --queue (weights 1..1000): the queues share --concurrency slots by weight (default: each queue its own --concurrency)")
	fs.BoolVar(&o.strict, "strict", false, "with --weights: strict priority, the highest weight with tasks due first")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("unexpected argument %q (see --help)", fs.Arg(0))
	}
	return o.validate()
}

// validate checks the flags and builds the library's configs, checked by
// their own Validate.
func (o *workerOptions) validate() error {
	if strings.TrimSpace(o.command) == "" {
		return usagef("--exec is required: the command to run for each task (see --help)")
	}
	for q := range strings.SplitSeq(o.queueSpec, ",") {
		if q = strings.TrimSpace(q); q != "" {
			if err := validate.Queue(q); err != nil {
				return usagef("--queue: %v", err)
			}
			o.queues = append(o.queues, q)
		}
	}
	if len(o.queues) == 0 {
		return usagef("--queue is required: the queues to work on (see --help)")
	}
	if o.concurrency < 1 {
		return usagef("--concurrency %d: 1..1000", o.concurrency)
	}
	var err error
	if o.group, err = parseWeights(o.weights, o.strict, o.queues, o.concurrency); err != nil {
		return err
	}
	if o.transactional && o.clearPayload {
		// The command's delayq_complete writes the done row, not the worker.
		return usagef("--clear-payload with --transactional: set delayq.clear_payload_on_done for the command's role instead (ALTER ROLE ... SET delayq.clear_payload_on_done = on)")
	}
	if o.dead < 0 || o.dead > 255 {
		return usagef("--dead-exit-code %d: 1..255, or 0 for none", o.dead)
	}
	if o.heartbeat == 0 {
		o.heartbeat = o.lease / 3
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"lease", o.lease}, {"heartbeat", o.heartbeat}, {"shutdown-timeout", o.shutdown}, {"backoff-base", o.backoffBase}, {"backoff-max", o.backoffMax}} {
		if d.v < 0 || d.v == 0 && d.name != "shutdown-timeout" {
			return usagef("--%s %v: must be positive", d.name, d.v)
		}
	}
	o.worker = delayq.WorkerConfig{Lease: o.lease, HeartbeatInterval: o.heartbeat, ShutdownTimeout: o.shutdown}
	if o.shutdown == 0 {
		o.worker.ShutdownTimeout = -1
	}
	o.queue = delayq.QueueConfig{
		Concurrency: o.concurrency, MaxAttempts: o.maxAttempts, ClearPayload: o.clearPayload,
		Backoff: delayq.Backoff{Base: o.backoffBase, Max: o.backoffMax},
	}
	for _, err := range []error{o.worker.Validate(), o.queue.Validate()} {
		if err != nil {
			return usagef("%s", libraryMessage(err, delayq.ErrInvalidConfig))
		}
	}
	_, err = newOutbox(o.conn.schema)
	return err
}

// runWorker runs the exec handler on the client, for each queue.
func runWorker(ctx context.Context, m *Main, args []string) error {
	var o workerOptions
	if err := o.parse(m, args); err != nil {
		return err
	}
	logger, deps, err := o.sidecarFlags.open(ctx, m, &o.conn)
	if err != nil {
		return err
	}
	defer deps.close()
	client, err := delayq.New(deps.pool, deps.rdb, delayq.Config{
		Schema: o.conn.schema, Prefix: o.conn.prefix, Database: o.conn.database, Logger: logger, Registerer: deps.reg, Worker: o.worker,
	})
	if err != nil {
		return usagef("%s", libraryMessage(err, delayq.ErrInvalidConfig))
	}
	// A read-only file system (no TMPDIR) costs the commands their retry delay only.
	retryDir, err := os.MkdirTemp("", "delayq-worker-")
	if err != nil {
		logger.Warn("worker: no directory for DELAYQ_RETRY_AFTER_FILE: failed commands are retried after the backoff", "err", err)
		retryDir = ""
	} else {
		defer os.RemoveAll(retryDir)
	}
	h := &execHandler{command: o.command, deadExit: o.dead, retryDir: retryDir}
	if o.transactional {
		h.tx = &execTx{
			databaseURL: o.conn.databaseURL, schema: o.conn.schema, pool: deps.pool,
			store: taskstate.New(taskstate.Config{Schema: o.conn.schema}),
		}
	}
	for _, q := range o.queues {
		if err := client.Handle(q, h.handle, o.queue); err != nil {
			return usagef("%v", err)
		}
	}
	if o.group != nil {
		if err := client.Prioritize(*o.group); err != nil {
			return usagef("--weights: %v", err)
		}
	}
	admin, err := deps.startAdmin(o.listen, logger)
	if err != nil {
		return err
	}
	logger.Info("worker: starting",
		"database", redactURL(o.conn.databaseURL), "redis", redactURL(o.conn.redisURL),
		"schema", o.conn.schema, "prefix", o.conn.namespace(), "queues", strings.Join(o.queues, ","),
		"concurrency", o.concurrency, "weights", o.weights, "strict", o.strict, "transactional", o.transactional, "lease", client.Config().Worker.Lease.String(), "admin", adminAddr(admin))
	return stopAdmin(ctx, admin, client.Run(ctx))
}

// execHandler runs a shell command per task.
type execHandler struct {
	command  string
	deadExit int
	// retryDir holds the runs' DELAYQ_RETRY_AFTER_FILE, named by seq.
	retryDir string
	seq      atomic.Uint64
	tx       *execTx // with --transactional
}

// taskEnviron is the worker's environment without the servers' URLs (and the
// passwords in them): a task's command has no business with delayq's stores
// (but for DELAYQ_DATABASE_URL with --transactional).
func taskEnviron() []string {
	env := os.Environ()
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "REDIS_URL=") {
			out = append(out, kv)
		}
	}
	return out
}

func (h *execHandler) handle(ctx context.Context, t *delayq.Task) error {
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", h.command)
	cmd.Stdin = bytes.NewReader(t.Payload)
	out := &tailBuffer{max: 4 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(taskEnviron(),
		"DELAYQ_QUEUE="+t.Queue,
		"DELAYQ_TASK_ID="+t.ID,
		"DELAYQ_IDEMPOTENCY_KEY="+t.IdempotencyKey(),
		"DELAYQ_VERSION="+strconv.Itoa(t.Version),
		"DELAYQ_ATTEMPT="+strconv.Itoa(t.Attempt),
		"DELAYQ_MAX_ATTEMPTS="+strconv.Itoa(t.MaxAttempts),
		"DELAYQ_DUE="+t.Due.UTC().Format(time.RFC3339Nano),
	)
	var retryFile string
	if h.retryDir != "" {
		retryFile = filepath.Join(h.retryDir, strconv.FormatUint(h.seq.Add(1), 10))
		defer os.Remove(retryFile)
		cmd.Env = append(cmd.Env, "DELAYQ_RETRY_AFTER_FILE="+retryFile)
	}
	if h.tx != nil {
		cmd.Env = append(cmd.Env, "DELAYQ_DATABASE_URL="+h.tx.databaseURL, "DELAYQ_SCHEMA="+h.tx.schema)
	}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = execKillDelay
	err := cmd.Run()
	if err == nil {
		if h.tx != nil {
			return h.tx.completed(ctx, t)
		}
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("command stopped: %w", context.Cause(ctx))
	}
	msg := err.Error()
	if tail := out.tail(errorTailBytes); tail != "" {
		msg += ": " + tail
	}
	var exitErr *exec.ExitError
	if h.deadExit != 0 && errors.As(err, &exitErr) && exitErr.ExitCode() == h.deadExit {
		return delayq.NoRetry(errors.New(msg))
	}
	if retryFile == "" {
		return errors.New(msg)
	}
	d, bad := readRetryAfter(retryFile)
	if bad != "" {
		msg += " (DELAYQ_RETRY_AFTER_FILE: " + bad + ": the backoff applies)"
	}
	if d > 0 {
		return delayq.RetryAfter(d, errors.New(msg))
	}
	return errors.New(msg)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

// tail returns the last n bytes, as one trimmed line.
func (t *tailBuffer) tail(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.Join(strings.Fields(strings.ToValidUTF8(string(t.b), "?")), " ")
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return strings.ToValidUTF8(s, "")
}

// parseWeights reads --weights (NAME=WEIGHT,...), which must name every queue of
// --queue once, into a priority group of concurrency slots; nil without --weights.
func parseWeights(spec string, strict bool, queues []string, concurrency int) (*delayq.PriorityGroup, error) {
	if strings.TrimSpace(spec) == "" {
		if strict {
			return nil, usagef("--strict needs --weights")
		}
		return nil, nil
	}
	g := delayq.PriorityGroup{Queues: map[string]int{}, Strict: strict, Concurrency: concurrency}
	for item := range strings.SplitSeq(spec, ",") {
		name, w, ok := strings.Cut(strings.TrimSpace(item), "=")
		n, err := strconv.Atoi(w)
		if !ok || err != nil {
			return nil, usagef("--weights: %q is not NAME=WEIGHT", item)
		}
		if _, dup := g.Queues[name]; dup {
			return nil, usagef("--weights: queue %q named twice", name)
		}
		g.Queues[name] = n
	}
	for _, q := range queues {
		if _, ok := g.Queues[q]; !ok {
			return nil, usagef("--weights: no weight for queue %q of --queue", q)
		}
	}
	if len(g.Queues) != len(queues) {
		return nil, usagef("--weights names a queue that is not in --queue")
	}
	if err := g.Validate(); err != nil {
		return nil, usagef("--weights: %s", strings.TrimPrefix(err.Error(), delayq.ErrInvalidConfig.Error()+": "))
	}
	return &g, nil
}
