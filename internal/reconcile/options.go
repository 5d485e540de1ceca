package reconcile

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/transition"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// DB is what the functions of this package need from Postgres: *pgxpool.Pool and
// *pgx.Conn satisfy it.
type DB interface {
	outbox.Querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Options configure Reconcile, Check, Stats and the dead-letter functions (each
// reads the fields it needs). The zero value means every default.
type Options struct {
	// Queues limits the work to these queues. Default (nil): every queue with rows
	// in the outbox or keys in Redis.
	Queues []string
	// AlsoQueues adds these queues to the default list (when Queues is nil): the
	// dashboard's queues that have controls (delayq_queues) and no task yet.
	AlsoQueues []string
	// Schema holds the outbox table. Default "public".
	Schema string
	// NotifyChannel is the channel a dead retry wakes the relay on; it must be the
	// relay's. Default "delayq_outbox".
	NotifyChannel string
	// DryRun makes Reconcile report what it would repair without changing anything.
	DryRun bool
	// Deep also SCANs each queue's Redis node for task hashes outside every ZSET
	// (a done record of a pruned row, a hash a lost write left), and lists queues by
	// SCAN too. Without it the walk reads the outbox, the queue registry and the
	// queues' ZSETs: its cost follows the queues, not the keyspace. Default false.
	Deep bool
	// BatchSize is how many rows, or Redis ids, one step reads and repairs.
	// Default 500; 1..1000.
	BatchSize int
	// Grace: a task queued in Postgres and dead in Redis is left alone while its
	// death (its score in the dead ZSET) is younger than Grace, because whoever
	// declared it dead writes that to Postgres right after. Default 1 minute; -1
	// means none.
	Grace time.Duration
	// Samples is how many task ids each category of a Report keeps. Default 10;
	// -1 keeps none.
	Samples int
	// Progress, when set, is called after every step with the work done so far.
	Progress func(Progress)
	// Logger receives a debug line per repair step. Default: discard.
	Logger *slog.Logger
	// Observer, when set, receives every inconsistency found, as it is found
	// (repaired, or left alone), for metrics or tracing. Default nil.
	Observer Observer
	// ExactCounts makes Stats count the done and cancelled rows exactly, reading
	// every row of the outbox, whatever its size. Default false: above
	// EstimateFinishedAbove rows they are estimated from the planner's statistics
	// and QueueStats.Estimated says so (the live and dead counts are always exact).
	ExactCounts bool

	// estimateAbove, set by tests, replaces EstimateFinishedAbove.
	estimateAbove float64
	// beforeSettle, set by tests, runs between the first read of a step and the
	// second read that decides its repairs.
	beforeSettle func(queue string, ids []string)
}

// WithDefaults returns a copy of o with zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.Schema == "" {
		o.Schema = taskstate.DefaultSchema
	}
	if o.NotifyChannel == "" {
		o.NotifyChannel = taskstate.DefaultNotifyChannel
	}
	if o.BatchSize == 0 {
		o.BatchSize = 500
	}
	if o.Grace == 0 {
		o.Grace = time.Minute
	}
	if o.Samples == 0 {
		o.Samples = 10
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return o
}

func (o Options) validate() error {
	for _, q := range o.Queues {
		if err := validate.Queue(q); err != nil {
			return fmt.Errorf("%w: Queues: %w", ErrInvalidOptions, err)
		}
	}
	switch {
	case o.BatchSize < 1 || o.BatchSize > 1000:
		return fmt.Errorf("%w: BatchSize %d: 1..1000", ErrInvalidOptions, o.BatchSize)
	case o.Grace < 0 && o.Grace != -1:
		return fmt.Errorf("%w: Grace %v: positive, or -1 for none", ErrInvalidOptions, o.Grace)
	case o.Samples < -1:
		return fmt.Errorf("%w: Samples %d: 0 or more, or -1 for none", ErrInvalidOptions, o.Samples)
	}
	return nil
}

// Validate reports whether o (with the defaults applied) is valid, without
// touching a server. The error wraps ErrInvalidOptions.
func (o Options) Validate() error {
	_, _, err := o.prepare()
	return err
}

// prepare applies the defaults, validates and builds the statements.
func (o Options) prepare() (Options, taskstate.Statements, error) {
	o = o.WithDefaults()
	if err := o.validate(); err != nil {
		return o, taskstate.Statements{}, err
	}
	ob, err := outbox.New(outbox.Config{Schema: o.Schema, NotifyChannel: o.NotifyChannel})
	if err != nil {
		return o, taskstate.Statements{}, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	return o, taskstate.NewStatements(taskstate.Config{Schema: ob.Config().Schema, NotifyChannel: ob.Config().NotifyChannel}), nil
}

// ops returns the transitions on the outbox of o (prepared) and dq (nil: the
// Postgres-only ones).
func (o Options) ops(dq *dispatch.Client) *transition.Ops {
	schema, channel := o.Schema, o.NotifyChannel
	if schema == "" {
		schema = taskstate.DefaultSchema
	}
	if channel == "" {
		channel = taskstate.DefaultNotifyChannel
	}
	return transition.New(taskstate.New(taskstate.Config{Schema: schema, NotifyChannel: channel}), dq)
}

// Progress is what Options.Progress gets after each step.
type Progress struct {
	// Queue is the queue being worked on, and Phase "postgres" (walking the outbox)
	// or "redis" (walking Redis for ids the outbox does not know).
	Queue, Phase string
	// Done counts the rows (phase postgres) or Redis ids (phase redis) of this queue
	// examined so far; Total is the queue's outbox rows at the start (0 in phase
	// redis, whose size is not known in advance).
	Done, Total int
	// QueueIndex counts the queues from 1 to Queues.
	QueueIndex, Queues int
	// Found counts the inconsistencies found so far, in all queues.
	Found int
}

// Observer receives what Reconcile and Check find, in the manner of pgx's tracers
// (the relay's self-healing reports through relay.Observer). It is called from the
// pass's goroutine and must return quickly.
type Observer interface {
	Divergence(ctx context.Context, d Divergence)
}

// Divergence is one task on which PostgreSQL and Redis disagree.
type Divergence struct {
	Queue, ID string
	Kind      Kind
	// Repaired: Redis was made to agree with Postgres. Skipped: left alone (a dry
	// run, a task that changed meanwhile, a death younger than Grace).
	Repaired, Skipped bool
}
