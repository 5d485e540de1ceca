// Package clientkit builds a delayq client from parts the module's own tools
// configured themselves (a dispatch client with their key prefix and reap
// backoff, an outbox client with their limits): the tests, the benchmarks and
// the CLI. Users build theirs with delayq.New.
package clientkit

import (
	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/outbox"
)

// NewClient returns a client on pool, dq and ob's configuration, with the
// worker configuration cfg and no relay.
func NewClient(pool outbox.DB, dq *dispatch.Client, ob *outbox.Client, cfg delayq.WorkerConfig) (*delayq.Client, error) {
	oc := ob.Config()
	return delayq.New(pool, dq.AsRedis(), delayq.Config{Schema: oc.Schema, NotifyChannel: oc.NotifyChannel, Outbox: oc, Worker: cfg})
}
