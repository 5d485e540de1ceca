package validate

import (
	"strings"
	"unicode/utf8"
)

// The limits of a task, one set for every path: whatever the outbox accepts, the
// relay moves and the Redis scripts accept (TestLimitsAgree crosses each on every
// path). The scripts' own bounds (delayq/lua) are these numbers too.
const (
	// MaxAttempts bounds a task's max attempts (and its attempt count).
	MaxAttempts = 1_000_000
	// DefaultMaxAttempts is used for a task that sets none.
	DefaultMaxAttempts = 25
	// DefaultMaxPayloadBytes is the payload limit a producer gets by default.
	DefaultMaxPayloadBytes = 64 << 10
	// MaxPayloadBytes is the hard limit of a payload: what a producer may allow at
	// most ("no limit" in its configuration means this), and what the relay moves
	// to Redis whatever the Redis client's own setting. Payloads travel through
	// Redis and into a worker's memory: pass references to large data.
	MaxPayloadBytes = 16 << 20
	// MaxErrorBytes bounds the error summary kept with a task, in Postgres and
	// Redis alike.
	MaxErrorBytes = 500
	// MaxVersion bounds a task's version (an int4 in Postgres).
	MaxVersion = 1<<31 - 1
)

// ErrorSummary makes an error message fit the promise of a short summary: valid
// UTF-8, no NUL byte (Postgres refuses it in text), at most MaxErrorBytes bytes, cut
// on a rune boundary with an ellipsis.
func ErrorSummary(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) <= MaxErrorBytes {
		return s
	}
	const ellipsis = "…"
	cut := MaxErrorBytes - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
