package delayqtype

import "time"

// QueueControl is one queue's controls: whether it is paused, its rate limit,
// its shard count and its limits per concurrency key, as PostgreSQL (the truth)
// holds them.
type QueueControl struct {
	Queue  string `json:"queue"`
	Paused bool   `json:"paused"`
	// Rate caps the queue's starts across every worker (Limit 0: none).
	Rate RateLimit `json:"rate_limit"`
	// Shards is the number of shards the queue's Redis keys are split into
	// (1..64; 1, the default, is the unsharded layout).
	Shards int `json:"shards"`
	// KeyConcurrency caps the runs of one concurrency key (outbox.Task.
	// ConcurrencyKey) at once across every worker (0: none).
	KeyConcurrency int `json:"key_concurrency,omitempty"`
	// KeyThrottle caps the starts of one concurrency key in any KeyWindow
	// (0: none; KeyWindow is then 0).
	KeyThrottle int           `json:"key_throttle,omitempty"`
	KeyWindow   time.Duration `json:"key_window,omitempty"`
	// Version is bumped by every change; Redis applies a control only over an
	// older version.
	Version   int64     `json:"version"`
	UpdatedAt time.Time `json:"updated_at"`
}
