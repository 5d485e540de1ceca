package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// enqueueOptions is what 'delayq enqueue' was asked, and the task built from it.
type enqueueOptions struct {
	conn                          connFlags
	task                          taskFlags
	when                          whenFlags
	payload, payloadFile, startBy string
	maxAttempts, priority         int
	payloadGiven                  bool

	t outbox.Task
}

func (o *enqueueOptions) parse(m *Main, args []string) error {
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
	o.conn.register(fs, m, true, false)
	o.task.register(fs)
	o.when.register(fs)
	fs.StringVar(&o.payload, "payload", "", "the payload, as given")
	fs.StringVar(&o.payloadFile, "payload-file", "", "read the payload from this file ('-': standard input)")
	fs.IntVar(&o.maxAttempts, "max-attempts", 0, "runs before the task is dead (0: the outbox default, 25)")
	fs.StringVar(&o.startBy, "start-by", "", "the latest start, RFC 3339, not before the due time: a task that cannot start by then is dead with the reason, never run late")
	fs.IntVar(&o.priority, "priority", 0, "0..9: among the queue's due tasks, higher runs first (0: the default, the lowest)")
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	o.payloadGiven = isSet(fs, "payload")
	if err := o.task.check(); err != nil {
		return err
	}
	delay, at, _, err := o.when.parse(fs)
	if err != nil {
		return err
	}
	o.t = outbox.Task{Queue: o.task.queue, ID: o.task.id, Delay: delay, RunAt: at, MaxAttempts: o.maxAttempts, Priority: o.priority}
	return o.validate()
}

// validate reads the payload and checks the task by the outbox's rules.
func (o *enqueueOptions) validate() error {
	if o.payloadGiven && o.payloadFile != "" {
		return usagef("give --payload or --payload-file, not both")
	}
	var err error
	o.t.Payload = []byte(o.payload)
	switch o.payloadFile {
	case "":
	case "-":
		if o.t.Payload, err = io.ReadAll(os.Stdin); err != nil {
			return fmt.Errorf("read the payload from standard input: %w", err)
		}
	default:
		if o.t.Payload, err = os.ReadFile(o.payloadFile); err != nil {
			return fmt.Errorf("read the payload: %w", err)
		}
	}
	if o.startBy != "" {
		if o.t.StartBy, err = time.Parse(time.RFC3339Nano, o.startBy); err != nil {
			return usagef("--start-by %q: want RFC 3339, e.g. 2030-01-02T15:04:05Z", o.startBy)
		}
		if o.t.StartBy.IsZero() { // the library reads it as "no deadline"
			return usagef("--start-by %q: %v: the zero time; leave --start-by out for no deadline", o.startBy, validate.ErrInvalidStartBy)
		}
	}
	ob, err := newOutbox(o.conn.schema)
	if err != nil {
		return err
	}
	if err := ob.Validate(o.t); err != nil {
		return usagef("%v", err)
	}
	return nil
}

// runEnqueue enqueues through package outbox, the producer that needs no
// Redis.
func runEnqueue(ctx context.Context, m *Main, args []string) error {
	var o enqueueOptions
	if err := o.parse(m, args); err != nil {
		return err
	}
	ob, err := newOutbox(o.conn.schema)
	if err != nil {
		return err
	}
	pool, err := o.conn.openPostgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := ob.Enqueue(ctx, pool, o.t)
	if errors.Is(err, validate.ErrInvalidStartBy) {
		// Refused by the statement: before now plus --delay on the database clock,
		// or already past. The library's words after its field name.
		_, why, _ := strings.Cut(err.Error(), validate.ErrInvalidStartBy.Error()+": ")
		return usagef("--start-by %s; nothing enqueued", why)
	}
	if err != nil {
		return err
	}
	if res.Duplicate {
		fmt.Fprintf(m.Stdout, "duplicate: %s/%s exists already; nothing changed\n", o.t.Queue, o.t.ID)
		return nil
	}
	fmt.Fprintf(m.Stdout, "enqueued %s/%s, due %s\n", o.t.Queue, o.t.ID, res.RunAt.UTC().Format(time.RFC3339Nano))
	return nil
}

// cancelOptions is what 'delayq cancel' was asked.
type cancelOptions struct {
	conn connFlags
	task taskFlags
}

func (o *cancelOptions) parse(m *Main, args []string) error {
	fs := newFlagSet(m, "cancel", "cancel --queue q --id x",
		"  delayq cancel --queue payment --id order-1001\n\n"+
			"The outbox row (pending or queued) becomes cancelled: a worker that runs the task\n"+
			"anyway cannot complete it. With a Redis URL the task is also removed from Redis at\n"+
			"once; without one, the next reconcile removes it. A task that is done, dead or\n"+
			"cancelled already is an error (exit 1).\n")
	o.conn.register(fs, m, true, true)
	o.task.register(fs)
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	return o.task.check()
}

// runCancel cancels through the client: in both stores with a Redis URL, else
// in PostgreSQL alone, through the client's outbox.
func runCancel(ctx context.Context, m *Main, args []string) error {
	var o cancelOptions
	if err := o.parse(m, args); err != nil {
		return err
	}
	withRedis := o.conn.redisURL != ""
	s, err := o.conn.openStores(ctx, withRedis)
	if err != nil {
		return err
	}
	defer s.close()
	q, id := o.task.queue, o.task.id
	if !withRedis {
		if err := s.client.Outbox().Cancel(ctx, s.pool, q, id); err != nil {
			return err
		}
		fmt.Fprintf(m.Stdout, "cancelled %s/%s (no Redis URL: the next reconcile removes it from Redis)\n", q, id)
		return nil
	}
	if err := s.client.Cancel(ctx, q, id); err != nil {
		return err
	}
	fmt.Fprintf(m.Stdout, "cancelled %s/%s and removed it from Redis (if Redis held it)\n", q, id)
	return nil
}

// rescheduleOptions is what 'delayq reschedule' was asked.
type rescheduleOptions struct {
	conn connFlags
	task taskFlags
	when whenFlags
	at   time.Time
}

func (o *rescheduleOptions) parse(m *Main, args []string) error {
	fs := newFlagSet(m, "reschedule", "reschedule --queue q --id x (--delay d | --at t)",
		"  delayq reschedule --queue payment --id order-1001 --delay 1h\n"+
			"  delayq reschedule --queue report --id 2030-01 --at 2030-02-02T06:00:00Z\n\n"+
			"The outbox row (pending or queued) gets the new run time and a new version, and\n"+
			"goes back to pending: the relay replaces the task in Redis, and a worker running\n"+
			"the old version cannot complete it. Attempts so far are kept. --delay counts from\n"+
			"now on this machine's clock.\n")
	o.conn.register(fs, m, true, false)
	o.task.register(fs)
	o.when.register(fs)
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	if err := o.task.check(); err != nil {
		return err
	}
	delay, at, given, err := o.when.parse(fs)
	if err != nil {
		return err
	}
	if !given {
		return usagef("--delay or --at is required")
	}
	if at.IsZero() {
		at = time.Now().Add(delay)
	}
	o.at = at
	return nil
}

// runReschedule reschedules through the client (PostgreSQL alone: the relay
// replaces the task in Redis).
func runReschedule(ctx context.Context, m *Main, args []string) error {
	var o rescheduleOptions
	if err := o.parse(m, args); err != nil {
		return err
	}
	s, err := o.conn.openStores(ctx, false)
	if err != nil {
		return err
	}
	defer s.close()
	if err := s.client.Reschedule(ctx, o.task.queue, o.task.id, o.at); err != nil {
		if isUsage(err) {
			return usagef("%v", err)
		}
		return err
	}
	fmt.Fprintf(m.Stdout, "rescheduled %s/%s to %s\n", o.task.queue, o.task.id, o.at.UTC().Format(time.RFC3339Nano))
	return nil
}
