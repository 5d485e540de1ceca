// Package ctlwrite hands package delayq's write of a queue's controls into Redis
// (its ctl script) to internal/queuectl, the one writer of that copy, without
// making it public: a caller outside the module cannot import this package, so a
// user changes a control only through the operation that writes Postgres first.
// Package delayq sets Write in its init (as grpc-go's internal package hands
// unexported functions between its packages).
package ctlwrite

import (
	"context"

	"github.com/delayq/delayq/internal/validate"
)

// Controls are the fields of a queue's controls that Redis holds.
type Controls struct {
	Paused bool
	Rate   validate.RateLimit
	// Shards is the queue's shard count, 1..64 (0 keeps the count Redis holds).
	Shards int
}

// Write writes queue's controls at version into Redis through client (a
// *delayq.Client) and reports whether any shard took them (a version not newer
// than the one held changes nothing). Set by package delayq.
var Write func(ctx context.Context, client any, queue string, version int64, c Controls) (applied bool, err error)
