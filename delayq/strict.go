package delayq

import "github.com/delayq/delayq/outbox"

// bindQueue records q's payload type on the outbox client of c's worker before
// its handler is registered: a producer of another type for the queue on the
// same client is then refused, and a registration after one is
// (outbox.ErrQueueType).
func bindQueue[T any](c *Client, q outbox.Queue[T]) error {
	return q.Bind(c.w.ob)
}
