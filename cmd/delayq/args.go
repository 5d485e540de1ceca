package main

import (
	"errors"
	"time"

	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// The arguments that name tasks and times, shared by enqueue, cancel,
// reschedule and dead.

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
			return 0, time.Time{}, false, usagef("--at %q: %v: the zero time; leave --at out to run now", w.at, validate.ErrInvalidRunAt)
		}
	}
	return w.delay, at, isSet(fs, "delay") || w.at != "", nil
}

func newOutbox(schema string) (*outbox.Client, error) {
	ob, err := outbox.New(outbox.Config{Schema: schema})
	if err != nil {
		return nil, usagef("--schema: %v", err)
	}
	return ob, nil
}

// isUsage reports whether err is a mistake in the input rather than a failure.
func isUsage(err error) bool {
	for _, s := range []error{outbox.ErrInvalidQueue, outbox.ErrInvalidTaskID, validate.ErrInvalidDelay,
		validate.ErrInvalidRunAt, outbox.ErrPayloadTooLarge, validate.ErrInvalidMaxAttempts, validate.ErrInvalidStartBy, reconcile.ErrInvalidOptions} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}
