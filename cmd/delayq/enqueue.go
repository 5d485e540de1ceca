package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/transition"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// taskFlags are the flags naming one task.
type taskFlags struct {
	queue, id string
}

func (t *taskFlags) register(fs *flagSet) {
	fs.StringVar(&t.queue, "queue", "", "the task's queue (required)")
	fs.StringVar(&t.id, "id", "", "the task id, unique in its queue (required)")
}

func (t *taskFlags) check() error {
	if t.queue == "" || t.id == "" {
		return usagef("--queue and --id are required (see --help)")
	}
	if err := validate.Queue(t.queue); err != nil {
		return usagef("--queue: %v", err)
	}
	if err := validate.TaskID(t.id); err != nil {
		return usagef("--id: %v", err)
	}
	return nil
}

// whenFlags are --delay and --at, of which one may be given.
type whenFlags struct {
	delay time.Duration
	at    string
}

func (w *whenFlags) register(fs *flagSet) {
	fs.DurationVar(&w.delay, "delay", 0, "run after this long, e.g. 90s, 15m, 2h")
	fs.StringVar(&w.at, "at", "", "run at this time, RFC 3339, e.g. 2030-01-02T15:04:05Z")
}

// runAt returns the time given with --at (zero if none), or an error for both.
func (w *whenFlags) parse(fs *flagSet) (delay time.Duration, at time.Time, given bool, err error) {
	if isSet(fs, "delay") && w.at != "" {
		return 0, time.Time{}, false, usagef("give --delay or --at, not both")
	}
	if w.delay < 0 {
		return 0, time.Time{}, false, usagef("--delay %v: must not be negative", w.delay)
	}
	if w.at != "" {
		at, err = time.Parse(time.RFC3339Nano, w.at)
		if err != nil {
			return 0, time.Time{}, false, usagef("--at %q: want RFC 3339, e.g. 2030-01-02T15:04:05Z", w.at)
		}
		// The library reads a zero run-at as "not set", that is now: a zero given
		// here is an unset timestamp, not a wish.
		if at.IsZero() {
			return 0, time.Time{}, false, usagef("--at %q: %v: the zero time; leave --at out to run now", w.at, outbox.ErrInvalidRunAt)
		}
	}
	return w.delay, at, isSet(fs, "delay") || w.at != "", nil
}

func isSet(fs *flagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func newOutbox(schema string) (*outbox.Client, error) {
	ob, err := outbox.New(outbox.Config{Schema: schema})
	if err != nil {
		return nil, usagef("--schema: %v", err)
	}
	return ob, nil
}

func runEnqueue(ctx context.Context, m *Main, args []string) error {
	var conn connFlags
	var task taskFlags
	var when whenFlags
	fs := newFlagSet(m, "enqueue",
		"enqueue --queue q --id x [--delay d | --at t] [--start-by t] [--payload s | --payload-file f] [--max-attempts n]",
		"  delayq enqueue --queue payment --id order-1001 --delay 15m --payload '{\"order\":1001}'\n"+
			"  delayq enqueue --queue report --id 2030-01 --at 2030-02-01T06:00:00Z --payload-file job.json\n"+
			"  echo hello | delayq enqueue --queue mail --id m-1 --payload-file -\n"+
			"  delayq enqueue --queue sms --id otp-7 --start-by 2030-01-02T15:05:00Z   # not run after that\n\n"+
			"The task goes into the outbox (Postgres) as pending; the relay moves it to Redis\n"+
			"when it falls due. An id that exists already is a duplicate: nothing changes and\n"+
			"the exit code is 0. The payload is not checked against the queue's payload type\n"+
			"(the CLI cannot know it): a typed worker makes a task whose JSON has a field its\n"+
			"type lacks, or fails its Validate, dead at once, with the reason.\n")
	conn.register(fs, m, true, false)
	task.register(fs)
	when.register(fs)
	payload := fs.String("payload", "", "the payload, as given")
	payloadFile := fs.String("payload-file", "", "read the payload from this file ('-': standard input)")
	maxAttempts := fs.Int("max-attempts", 0, "runs before the task is dead (0: the outbox default, 25)")
	startBy := fs.String("start-by", "", "the latest start, RFC 3339, not before the due time: a task that cannot start by then is dead with the reason, never run late")
	priority := fs.Int("priority", 0, "0..9: among the queue's due tasks, higher runs first (0: the default, the lowest)")
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	if err := task.check(); err != nil {
		return err
	}
	delay, at, _, err := when.parse(fs)
	if err != nil {
		return err
	}
	if isSet(fs, "payload") && *payloadFile != "" {
		return usagef("give --payload or --payload-file, not both")
	}
	body := []byte(*payload)
	switch *payloadFile {
	case "":
	case "-":
		if body, err = io.ReadAll(os.Stdin); err != nil {
			return fmt.Errorf("read the payload from standard input: %w", err)
		}
	default:
		if body, err = os.ReadFile(*payloadFile); err != nil {
			return fmt.Errorf("read the payload: %w", err)
		}
	}
	ob, err := newOutbox(conn.schema)
	if err != nil {
		return err
	}
	t := outbox.Task{Queue: task.queue, ID: task.id, Payload: body, Delay: delay, RunAt: at, MaxAttempts: *maxAttempts, Priority: *priority}
	if *startBy != "" {
		if t.StartBy, err = time.Parse(time.RFC3339Nano, *startBy); err != nil {
			return usagef("--start-by %q: want RFC 3339, e.g. 2030-01-02T15:04:05Z", *startBy)
		}
		if t.StartBy.IsZero() { // the library reads it as "no deadline"
			return usagef("--start-by %q: %v: the zero time; leave --start-by out for no deadline", *startBy, outbox.ErrInvalidStartBy)
		}
	}
	if err := ob.Validate(t); err != nil {
		return usagef("%v", err)
	}
	pool, err := conn.openPostgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := ob.Enqueue(ctx, pool, t)
	if errors.Is(err, outbox.ErrInvalidStartBy) {
		// Refused by the statement: before now plus --delay on the database clock,
		// or already past.
		return usagef("--start-by: %v", err)
	}
	if err != nil {
		return err
	}
	if res.Duplicate {
		fmt.Fprintf(m.Stdout, "duplicate: %s/%s exists already; nothing changed\n", task.queue, task.id)
		return nil
	}
	fmt.Fprintf(m.Stdout, "enqueued %s/%s, due %s\n", task.queue, task.id, res.RunAt.UTC().Format(time.RFC3339Nano))
	return nil
}

func runCancel(ctx context.Context, m *Main, args []string) error {
	var conn connFlags
	var task taskFlags
	fs := newFlagSet(m, "cancel", "cancel --queue q --id x",
		"  delayq cancel --queue payment --id order-1001\n\n"+
			"The outbox row (pending or queued) becomes cancelled: a worker that runs the task\n"+
			"anyway cannot complete it. With a Redis URL the task is also removed from Redis at\n"+
			"once; without one, the next reconcile removes it. A task that is done, dead or\n"+
			"cancelled already is an error (exit 1).\n")
	conn.register(fs, m, true, true)
	task.register(fs)
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	if err := task.check(); err != nil {
		return err
	}
	ob, err := newOutbox(conn.schema)
	if err != nil {
		return err
	}
	if conn.redisURL != "" {
		if err := checkRedisFlags(&conn); err != nil {
			return err
		}
	}
	pool, err := conn.openPostgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := ob.Cancel(ctx, pool, task.queue, task.id); err != nil {
		return err
	}
	if conn.redisURL == "" {
		fmt.Fprintf(m.Stdout, "cancelled %s/%s (no Redis URL: the next reconcile removes it from Redis)\n", task.queue, task.id)
		return nil
	}
	rdb, dq, err := openDelayq(ctx, &conn)
	if err != nil {
		return fmt.Errorf("cancelled %s/%s in Postgres, but: %w", task.queue, task.id, err)
	}
	defer rdb.Close()
	ops := transition.New(taskstate.New(taskstate.Config{Schema: ob.Config().Schema, NotifyChannel: ob.Config().NotifyChannel}), dq)
	removed, err := ops.RemoveFinished(ctx, pool, task.queue, task.id)
	if err != nil {
		return fmt.Errorf("cancelled %s/%s in Postgres, but: %w", task.queue, task.id, err)
	}
	if removed {
		fmt.Fprintf(m.Stdout, "cancelled %s/%s and removed it from Redis\n", task.queue, task.id)
	} else {
		fmt.Fprintf(m.Stdout, "cancelled %s/%s (it was not in Redis)\n", task.queue, task.id)
	}
	return nil
}

func runReschedule(ctx context.Context, m *Main, args []string) error {
	var conn connFlags
	var task taskFlags
	var when whenFlags
	fs := newFlagSet(m, "reschedule", "reschedule --queue q --id x (--delay d | --at t)",
		"  delayq reschedule --queue payment --id order-1001 --delay 1h\n"+
			"  delayq reschedule --queue report --id 2030-01 --at 2030-02-02T06:00:00Z\n\n"+
			"The outbox row (pending or queued) gets the new run time and a new version, and\n"+
			"goes back to pending: the relay replaces the task in Redis, and a worker running\n"+
			"the old version cannot complete it. Attempts so far are kept. --delay counts from\n"+
			"now on this machine's clock.\n")
	conn.register(fs, m, true, false)
	task.register(fs)
	when.register(fs)
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	if err := task.check(); err != nil {
		return err
	}
	delay, at, given, err := when.parse(fs)
	if err != nil {
		return err
	}
	if !given {
		return usagef("--delay or --at is required")
	}
	if at.IsZero() {
		at = time.Now().Add(delay)
	}
	ob, err := newOutbox(conn.schema)
	if err != nil {
		return err
	}
	pool, err := conn.openPostgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := ob.Reschedule(ctx, pool, task.queue, task.id, at); err != nil {
		if isUsage(err) {
			return usagef("%v", err)
		}
		return err
	}
	fmt.Fprintf(m.Stdout, "rescheduled %s/%s to %s\n", task.queue, task.id, at.UTC().Format(time.RFC3339Nano))
	return nil
}
