package delayq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"
)

// Next continues a run: it calls the next middleware, and the last one the
// handler. A transactional handler's writes are still in its transaction when
// Next returns: the worker commits them after the outermost middleware returned
// nil.
type Next func(ctx context.Context) error

// Middleware wraps every run of a handler, plain or transactional: it may change
// the context the rest of the run gets, act before and after it, and replace its
// error (nil commits, an error fails the run). Logging, tracing, panics and
// timeouts are all middleware; so are the built-ins (Recover, Timeout, Logging).
//
// Config.Middleware wraps every queue of a worker, outside QueueConfig.Middleware;
// the first of a list is the outermost. The worker's own Recover is outside them
// all, so a panic in a middleware fails the run like one in a handler.
type Middleware func(ctx context.Context, t *Task, next Next) error

// chain builds the run of h through mws, the first outermost.
func chain(mws []Middleware, t *Task, h Next) Next {
	for i := len(mws) - 1; i >= 0; i-- {
		mw, next := mws[i], h
		h = func(ctx context.Context) error { return mw(ctx, t, next) }
	}
	return h
}

// PanicError is the error of a run whose handler (or middleware) panicked, as
// Recover returns it. Its message is the panic value only (the task's last
// error); the stack goes to the log and, cut to 8 KiB, into the task's attempt
// history (Client.Attempts).
type PanicError struct {
	Value any
	Stack []byte
}

// Error is "panic: " and the value the handler panicked with.
func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// Recover turns a panic in the rest of the run into a *PanicError, logging it with
// its stack on log (nil: not logged). Every worker runs it outermost (with
// Config.Logger); add it yourself to recover closer to the handler.
func Recover(log *slog.Logger) Middleware {
	return func(ctx context.Context, t *Task, next Next) (err error) {
		defer func() {
			if v := recover(); v != nil {
				stack := debug.Stack()
				if log != nil {
					log.Error("worker: handler panicked", "queue", t.Queue, "id", t.ID,
						"attempt", t.Attempt, "panic", fmt.Sprint(v), "stack", string(stack))
				}
				err = &PanicError{Value: v, Stack: stack}
			}
		}()
		return next(ctx)
	}
}

// ErrTimeout is the cause of a context cancelled by Timeout, and wrapped in the
// run's error when the rest of the run fails after its time ran out.
var ErrTimeout = errors.New("worker: handler timed out")

// Timeout bounds the rest of the run to d: its context is cancelled with cause
// ErrTimeout, and a run that fails after that fails with an error wrapping
// ErrTimeout (and retries as any failure). A handler that ignores its context
// is not stopped; its lease is kept by the heartbeats.
func Timeout(d time.Duration) Middleware {
	return func(ctx context.Context, t *Task, next Next) error {
		ctx, cancel := context.WithTimeoutCause(ctx, d, ErrTimeout)
		defer cancel()
		err := next(ctx)
		if err != nil && errors.Is(context.Cause(ctx), ErrTimeout) && !errors.Is(err, ErrTimeout) {
			return fmt.Errorf("%w after %v: %w", ErrTimeout, d, err)
		}
		return err
	}
}

// Logging logs every run on log when it returns: at Debug when it succeeded, at
// Info when it failed (the worker logs what it does about a failure at Warn),
// with the queue, id, attempt, duration and error.
func Logging(log *slog.Logger) Middleware {
	return func(ctx context.Context, t *Task, next Next) error {
		start := time.Now()
		err := next(ctx)
		level, msg := slog.LevelDebug, "worker: run succeeded"
		attrs := []slog.Attr{slog.String("queue", t.Queue), slog.String("id", t.ID),
			slog.Int("attempt", t.Attempt), slog.Duration("duration", time.Since(start))}
		if err != nil {
			level, msg = slog.LevelInfo, "worker: run failed"
			attrs = append(attrs, slog.String("err", err.Error()))
		}
		log.LogAttrs(ctx, level, msg, attrs...)
		return err
	}
}
