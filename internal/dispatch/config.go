package dispatch

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/delayq/delayq/internal/validate"
)

// Config configures a Client. The zero value means every default.
type Config struct {
	// Prefix starts every key. Default "dq". 1..64 bytes of [A-Za-z0-9_.:-].
	Prefix string

	// DoneRetention is how long a completed task's hash stays as a dedupe record
	// (status done, payload removed), so that a direct Enqueue of the same id within
	// it is a duplicate. Default -1: the hash is deleted when the task is
	// acknowledged, and a finished task takes no Redis memory. Tasks that reach
	// Redis through the outbox and the relay need no record (Postgres is their
	// dedupe: the relay moves only pending rows, under their lock). Set a duration
	// only for tasks enqueued into Redis directly; each record takes about 144 B.
	DoneRetention time.Duration

	// DefaultMaxAttempts applies to tasks enqueued with MaxAttempts 0. Default 25.
	DefaultMaxAttempts int

	// MaxPayloadBytes limits a task payload. Default 64 KiB. Payloads over 64 bytes
	// make Redis store the task hash as a hash table instead of a listpack, which
	// costs several hundred bytes more per task.
	MaxPayloadBytes int

	// EnqueueBatch is the most tasks one enqueue script call carries; Enqueue
	// splits larger slices. Default 500, at most 10,000.
	EnqueueBatch int

	// ReapBackoffBase and ReapBackoffMax shape the delay before a task whose lease
	// expired runs again: d = min(max, base * 2^(attempt-1)), jittered to [d/2, d].
	// Defaults 1s and 10m: a crashed worker's task runs again about lease + reap
	// interval + 1s after the crash.
	ReapBackoffBase time.Duration
	ReapBackoffMax  time.Duration

	// MaxWait caps one Waiter.Wait, the backstop against lost wake-ups (for example
	// while the pub/sub connection reconnects). Default 30s.
	MaxWait time.Duration

	// ShardRefresh is how long the Client trusts the shard count it read of a
	// queue (Controls.Shards) before it reads it again. Default 1s. A change of
	// the count reaches a running Client within it, or sooner through a claim
	// (the claim script reports the count); an enqueue routed by a stale count is
	// refused by Redis and routed anew, never misplaced.
	ShardRefresh time.Duration

	// Logger receives rare events (pub/sub reconnects). Default: discard.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.DoneRetention == 0 {
		c.DoneRetention = -1
	}
	if c.DefaultMaxAttempts == 0 {
		c.DefaultMaxAttempts = 25
	}
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = 64 << 10
	}
	if c.EnqueueBatch == 0 {
		c.EnqueueBatch = 500
	}
	if c.ReapBackoffBase == 0 {
		c.ReapBackoffBase = time.Second
	}
	if c.ReapBackoffMax == 0 {
		c.ReapBackoffMax = 10 * time.Minute
	}
	if c.MaxWait == 0 {
		c.MaxWait = 30 * time.Second
	}
	if c.ShardRefresh == 0 {
		c.ShardRefresh = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

func (c Config) validate() error {
	if err := validate.Prefix(c.Prefix); err != nil {
		return fmt.Errorf("%w: Prefix: %w", ErrInvalidConfig, err)
	}
	switch {
	case c.DoneRetention != -1 && c.DoneRetention < time.Millisecond:
		return fmt.Errorf("%w: DoneRetention %v: at least 1ms, or -1", ErrInvalidConfig, c.DoneRetention)
	case c.DefaultMaxAttempts < 1 || c.DefaultMaxAttempts > validate.MaxAttempts:
		return fmt.Errorf("%w: DefaultMaxAttempts %d: 1..%d", ErrInvalidConfig, c.DefaultMaxAttempts, validate.MaxAttempts)
	case c.MaxPayloadBytes < 1:
		return fmt.Errorf("%w: MaxPayloadBytes %d: at least 1", ErrInvalidConfig, c.MaxPayloadBytes)
	case c.EnqueueBatch < 1 || c.EnqueueBatch > 10000:
		return fmt.Errorf("%w: EnqueueBatch %d: 1..10000", ErrInvalidConfig, c.EnqueueBatch)
	case c.ReapBackoffBase < time.Millisecond:
		return fmt.Errorf("%w: ReapBackoffBase %v: at least 1ms", ErrInvalidConfig, c.ReapBackoffBase)
	case c.ReapBackoffMax < c.ReapBackoffBase:
		return fmt.Errorf("%w: ReapBackoffMax %v below ReapBackoffBase %v", ErrInvalidConfig, c.ReapBackoffMax, c.ReapBackoffBase)
	case c.ShardRefresh < time.Millisecond:
		return fmt.Errorf("%w: ShardRefresh %v: at least 1ms", ErrInvalidConfig, c.ShardRefresh)
	case c.MaxWait < time.Millisecond:
		return fmt.Errorf("%w: MaxWait %v: at least 1ms", ErrInvalidConfig, c.MaxWait)
	}
	return nil
}
