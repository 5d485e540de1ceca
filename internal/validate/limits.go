package validate

import (
	"errors"
	"fmt"
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
	// MaxAttemptLog, MaxAttemptLogBytes, MaxAttemptErrorBytes and MaxStackBytes
	// bound a task's attempt history (the outbox column attempt_log): its newest
	// entries only, at most MaxAttemptLog of them and MaxAttemptLogBytes of JSON
	// in all (the newest is kept whatever its size), each entry's error cut to
	// MaxAttemptErrorBytes and a panic's stack to MaxStackBytes.
	MaxAttemptLog        = 20
	MaxAttemptLogBytes   = 64 << 10
	MaxAttemptErrorBytes = 1 << 10
	MaxStackBytes        = 8 << 10
	// MaxVersion bounds a task's version (an int4 in Postgres).
	MaxVersion = 1<<31 - 1
	// MaxTraceContextBytes bounds the trace context kept with a task (a W3C
	// traceparent is 55 bytes; the rest is room for a tracestate).
	MaxTraceContextBytes = 512
	// MaxPriority bounds a task's priority within its queue: 0 (the default, the
	// lowest) to MaxPriority (the highest; it runs first among the tasks due).
	MaxPriority = 9
)

// ErrInvalidTask reports a task field out of its bounds (outbox.ErrInvalidTask):
// the errors of the fields below wrap it, so a caller tells them apart by the
// message and the module's own code by errors.Is.
var ErrInvalidTask = errors.New("invalid task")

// The errors of a task's fields, each wrapping ErrInvalidTask.
var (
	// ErrInvalidDelay reports a negative delay.
	ErrInvalidDelay = fmt.Errorf("%w: delay", ErrInvalidTask)
	// ErrInvalidRunAt reports a run-at time that cannot be meant.
	ErrInvalidRunAt = fmt.Errorf("%w: run-at time", ErrInvalidTask)
	// ErrInvalidStartBy reports a start deadline out of range or before the due time.
	ErrInvalidStartBy = fmt.Errorf("%w: start deadline", ErrInvalidTask)
	// ErrInvalidMaxAttempts reports max attempts out of 0..MaxAttempts.
	ErrInvalidMaxAttempts = fmt.Errorf("%w: max attempts", ErrInvalidTask)
)

// ErrInvalidConflict reports a conflict policy (outbox Task.Replace,
// KeepRunAt, Debounce, MaxWait) that cannot be meant, or given where none is
// taken.
var ErrInvalidConflict = fmt.Errorf("%w: conflict policy", ErrInvalidTask)

// ErrInvalidPriority reports a task priority outside 0..MaxPriority.
var ErrInvalidPriority = fmt.Errorf("%w: priority", ErrInvalidTask)

// Priority checks a task's priority: 0..MaxPriority.
func Priority(p int) error {
	if p < 0 || p > MaxPriority {
		return fmt.Errorf("%w: %d: 0..%d (higher runs first; 0 is the default)", ErrInvalidPriority, p, MaxPriority)
	}
	return nil
}

// ErrInvalidTraceContext reports a trace context longer than MaxTraceContextBytes
// or with a byte outside printable ASCII.
var ErrInvalidTraceContext = fmt.Errorf("%w: trace context", ErrInvalidTask)

// TraceContext checks a task's trace context: "" (none), or at most
// MaxTraceContextBytes of printable ASCII (what W3C trace context headers hold).
func TraceContext(s string) error {
	if len(s) > MaxTraceContextBytes {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidTraceContext, len(s), MaxTraceContextBytes)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return fmt.Errorf("%w: byte %#x at %d: printable ASCII only", ErrInvalidTraceContext, s[i], i)
		}
	}
	return nil
}

// ErrorSummary makes an error message fit the promise of a short summary: valid
// UTF-8, no NUL byte (Postgres refuses it in text), at most MaxErrorBytes bytes, cut
// on a rune boundary with an ellipsis.
func ErrorSummary(s string) string { return Cut(s, MaxErrorBytes) }

// Cut makes s valid UTF-8 without a NUL byte, and at most n bytes (n > 3): cut
// on a rune boundary with an ellipsis. ErrorSummary and the attempt history's
// texts (MaxAttemptErrorBytes, MaxStackBytes) are cut by it.
func Cut(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) <= n {
		return s
	}
	const ellipsis = "…"
	cut := n - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
