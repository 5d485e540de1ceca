package validate

import (
	"errors"
	"fmt"
)

// MaxShards is the most shards a queue's Redis keys can be split into: the same
// number as delayq.MaxShards (which cannot be imported here: delayq imports this
// package), and the CHECK of delayq_queues.shards (migration 00014).
const MaxShards = 64

// ErrInvalidShards reports a queue shard count outside 1..MaxShards.
var ErrInvalidShards = errors.New("invalid shard count")

// Shards checks a queue's shard count: 1..MaxShards. (delayq.Controls takes 0 for
// 1; a count set in Postgres is always explicit.)
func Shards(n int) error {
	if n < 1 || n > MaxShards {
		return fmt.Errorf("%w: %d: 1..%d", ErrInvalidShards, n, MaxShards)
	}
	return nil
}
