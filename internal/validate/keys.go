package validate

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// The bounds of concurrency keys and of a queue's limits per key; the scripts
// (enqueue.lua, ctl.lua) check the same.
const (
	MaxConcurrencyKeyBytes = 200
	MaxKeyConcurrency      = 100_000
	MaxKeyThrottle         = 10_000
	MaxKeyWindow           = 24 * time.Hour
)

// ErrInvalidConcurrencyKey reports a task's concurrency key that is too long,
// not UTF-8, or holds a control character.
var ErrInvalidConcurrencyKey = fmt.Errorf("%w: concurrency key", ErrInvalidTask)

// ConcurrencyKey checks a task's concurrency key: "" (none), or 1..200 bytes of
// UTF-8 without control characters (it is shown in logs, the CLI and the
// dashboard, and names Redis keys).
func ConcurrencyKey(k string) error {
	if len(k) > MaxConcurrencyKeyBytes {
		return fmt.Errorf("%w: %d bytes: at most %d", ErrInvalidConcurrencyKey, len(k), MaxConcurrencyKeyBytes)
	}
	// The key is not quoted back: escaped, a short key of control bytes would
	// make a long message.
	for i := 0; i < len(k); {
		r, size := utf8.DecodeRuneInString(k[i:])
		if r == utf8.RuneError && size == 1 {
			return fmt.Errorf("%w: not UTF-8 at byte %d", ErrInvalidConcurrencyKey, i)
		}
		if r < 0x20 || (r >= 0x7f && r < 0xa0) {
			return fmt.Errorf("%w: control character %U at byte %d", ErrInvalidConcurrencyKey, r, i)
		}
		i += size
	}
	return nil
}

// ErrInvalidKeyLimits reports a queue's limits per concurrency key outside their
// bounds.
var ErrInvalidKeyLimits = errors.New("invalid limits per concurrency key")

// KeyLimits checks a queue's limits per concurrency key: concurrency runs of one
// key at once (0: no cap, else 1..MaxKeyConcurrency), throttle starts of one key
// in any window (0: no throttle, else 1..MaxKeyThrottle; window whole
// milliseconds, 1ms..MaxKeyWindow; ignored without a throttle).
func KeyLimits(concurrency, throttle int, window time.Duration) error {
	if concurrency < 0 || concurrency > MaxKeyConcurrency {
		return fmt.Errorf("%w: concurrency %d: 0 (none) .. %d runs of one key at once", ErrInvalidKeyLimits, concurrency, MaxKeyConcurrency)
	}
	if throttle < 0 || throttle > MaxKeyThrottle {
		return fmt.Errorf("%w: throttle %d: 0 (none) .. %d starts of one key per window", ErrInvalidKeyLimits, throttle, MaxKeyThrottle)
	}
	if throttle > 0 && (window < time.Millisecond || window > MaxKeyWindow || window%time.Millisecond != 0) {
		return fmt.Errorf("%w: window %v: whole milliseconds, 1ms .. %v", ErrInvalidKeyLimits, window, MaxKeyWindow)
	}
	return nil
}
