// Package delayqtype holds the types that delayq's packages share with their
// users: the state of a task in the outbox. It imports nothing of delayq, so
// every package can use it, the internal ones included (River keeps its shared
// types in rivertype for the same reason), and it stays where it is whatever
// the client above it becomes.
package delayqtype

import (
	"errors"
	"fmt"
)

// State is the state of a task in the outbox (its row's column state). The
// outbox, the relay, reconcile, stats, the dashboard and delayqtest all use this
// type; internal/taskstate owns the transitions between the states.
type State string

// The states. pending and queued are live (the task still has to run); done, dead
// and cancelled are finished. A finished row is kept for the retention (dead rows
// until a person retries or purges them), then deleted. waiting is neither: the
// task waits in Postgres for its dependencies (package workflow).
const (
	// StatePending: committed by the producer, not yet in Redis (or rescheduled,
	// or retried from dead: a new version waits for the relay).
	StatePending State = "pending"
	// StateQueued: the relay put this version in Redis.
	StateQueued State = "queued"
	// StateDone: a run's completion committed (for a transactional handler,
	// together with its effect).
	StateDone State = "done"
	// StateDead: out of attempts, told not to retry, or refused as invalid; it
	// waits for a person.
	StateDead State = "dead"
	// StateCancelled: cancelled by the producer, or by its handler, before it
	// finished.
	StateCancelled State = "cancelled"
	// StateWaiting: enqueued waiting on other tasks (package workflow); the
	// relay leaves it in Postgres until the last of them finishes, whose
	// transaction makes it pending (or dead, or cancelled, as the dependency's
	// policy says).
	StateWaiting State = "waiting"
)

// States returns every state, live ones first, in their lifecycle order, and
// waiting last (it came later: lists built from States keep their columns).
func States() []State {
	return []State{StatePending, StateQueued, StateDone, StateDead, StateCancelled, StateWaiting}
}

// Live reports whether the task still has to run and may be in Redis: pending
// or queued. A waiting task is neither live nor finished.
func (s State) Live() bool { return s == StatePending || s == StateQueued }

// Finished reports whether the task needs no run any more: done, dead or
// cancelled.
func (s State) Finished() bool { return s == StateDone || s == StateDead || s == StateCancelled }

// ErrUnknownState reports a string that names no state.
var ErrUnknownState = errors.New("delayqtype: unknown state")

// ParseState reads a state by its name; an unknown name is ErrUnknownState.
func ParseState(s string) (State, error) {
	for _, st := range States() {
		if string(st) == s {
			return st, nil
		}
	}
	return "", fmt.Errorf("%w %q", ErrUnknownState, s)
}
