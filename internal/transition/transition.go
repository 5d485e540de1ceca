// Package transition owns the task state machine as operations: each transition
// of taskstate.Transitions (its Op) is one function here that writes Postgres
// and then Redis in the transition's documented order, keyed by the version or
// the lease token that makes the Redis write idempotent. The worker, the relay,
// reconcile, the dashboard, the CLI and delayqtest call these operations; none of
// them runs a Redis write script or an outbox write statement of its own
// (TestOneOwnerOfTransitions).
//
// Where the Postgres part runs in a caller's transaction (a transactional
// handler's, a dead hook's), the operation takes that transaction and commits it
// itself, or returns a value only a commit produces (Done) that the Redis part
// requires: the caller cannot write Redis first.
package transition

import (
	"errors"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
)

// Ops runs the transitions on one outbox (its statements) and one Redis. It
// holds no connection: every Postgres part takes the Querier (or the
// transaction) to run on.
type Ops struct {
	store *taskstate.Store
	dq    *dispatch.Client
}

// New returns the operations writing the outbox of store and the Redis of dq.
func New(store *taskstate.Store, dq *dispatch.Client) *Ops {
	return &Ops{store: store, dq: dq}
}

// Store returns the outbox's statements, for reads.
func (o *Ops) Store() *taskstate.Store { return o.store }

// Claim is one claimed run: the version its copy holds and its lease token, the
// compare-and-set of every Redis write that settles it.
type Claim struct {
	taskstate.Key
	Token string
	// BeforeRedis, if set, is called once Postgres has committed, just before
	// the Redis write: the worker stops the lease's heartbeats there, which the
	// write revokes (a hook may have run long in the transaction before).
	BeforeRedis func()
}

func (c Claim) redis() {
	if c.BeforeRedis != nil {
		c.BeforeRedis()
	}
}

// Outcome is what an operation of a claimed run did.
type Outcome struct {
	// Applied: Postgres made the transition. False (without an error): the row
	// refused it (finished, or at another version) and Redis was not written.
	Applied bool
	// RedisErr is the Redis write's failure after Postgres committed: Postgres
	// stands, and a redelivery or the repair from Postgres settles Redis.
	// errors.Is(RedisErr, delayq.ErrLeaseLost): another holder has the task.
	RedisErr error
}

// ErrRefused reports a completion the outbox guard refused: the row is finished
// or at another version; nothing was committed and Redis was not written.
var ErrRefused = errors.New("transition: refused by the outbox row")
