// Package validate holds the rules that keep queue names and task ids safe to use
// both as Postgres values and inside Redis keys with a {queue} hash tag.
//
// The sentinels are re-exported by the public packages (outbox, delayq), so callers
// branch with errors.Is on whichever package they use.
package validate

import (
	"errors"
	"fmt"
	"time"
)

// Limits of identifiers. They keep keys short and make a hash tag impossible to break.
const (
	MaxQueueLen  = 64
	MaxTaskIDLen = 200
	MaxPrefixLen = 64
)

var (
	// ErrInvalidQueue reports a queue name that is empty, too long or has a
	// character outside [A-Za-z0-9_.-].
	ErrInvalidQueue = errors.New("invalid queue name")
	// ErrInvalidTaskID reports a task id that is empty, too long or has a character
	// outside printable ASCII, or one of '{' '}'.
	ErrInvalidTaskID = errors.New("invalid task id")
	// ErrInvalidPrefix reports a Redis key prefix that is too long or would
	// interfere with the hash tag.
	ErrInvalidPrefix = errors.New("invalid key prefix")
	// ErrInvalidDatabase reports a database key (several outbox databases
	// feeding one Redis) that breaks its rule.
	ErrInvalidDatabase = errors.New("invalid database key")
)

// Queue checks a queue name: 1..64 bytes of [A-Za-z0-9_.-].
func Queue(q string) error {
	if q == "" {
		return fmt.Errorf("%w: empty", ErrInvalidQueue)
	}
	if len(q) > MaxQueueLen {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidQueue, len(q), MaxQueueLen)
	}
	for i := 0; i < len(q); i++ {
		if !queueByte(q[i]) {
			return fmt.Errorf("%w: %q has %q at byte %d; allowed are letters, digits, '_', '.', '-'",
				ErrInvalidQueue, q, q[i], i)
		}
	}
	return nil
}

// TaskID checks a task id: 1..200 bytes of printable ASCII (0x21..0x7e) except
// '{' and '}'. Colons are allowed ("payment:order-1001"): the id is always the last
// part of a key, so it cannot change which key or which hash slot it names.
func TaskID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty", ErrInvalidTaskID)
	}
	if len(id) > MaxTaskIDLen {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidTaskID, len(id), MaxTaskIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e || c == '{' || c == '}' {
			return fmt.Errorf("%w: %q has %s at byte %d; allowed is printable ASCII except space, '{' and '}'",
				ErrInvalidTaskID, truncate(id), byteName(c), i)
		}
	}
	return nil
}

// byteName names a byte of an id for a message: ' ' (a space), '{', 0x07.
func byteName(c byte) string {
	switch {
	case c == ' ':
		return "a space"
	case c > 0x20 && c < 0x7f:
		return fmt.Sprintf("%q", c)
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

// Prefix checks a Redis key prefix: 1..64 bytes of [A-Za-z0-9_.:-].
func Prefix(p string) error {
	if p == "" {
		return fmt.Errorf("%w: empty", ErrInvalidPrefix)
	}
	if len(p) > MaxPrefixLen {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidPrefix, len(p), MaxPrefixLen)
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; !queueByte(c) && c != ':' {
			return fmt.Errorf("%w: %q has %q at byte %d", ErrInvalidPrefix, p, c, i)
		}
	}
	return nil
}

// MaxDatabaseLen is the longest database key.
const MaxDatabaseLen = 32

// Database checks the key naming one of several outbox databases: 1..32 bytes
// of [a-z0-9_-], starting with a letter or a digit. Lower case and no '.' or
// ':', so that it reads the same in a key prefix, a metric label and a flag.
func Database(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidDatabase)
	}
	if len(key) > MaxDatabaseLen {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidDatabase, len(key), MaxDatabaseLen)
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '-') {
			return fmt.Errorf("%w: %s at byte %d (1..%d bytes of [a-z0-9_-], starting with a letter or a digit)",
				ErrInvalidDatabase, byteName(c), i, MaxDatabaseLen)
		}
	}
	return nil
}

func queueByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-'
}

// truncate keeps error messages short when an id is hostile and long.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// TimeID formats t in UTC as outbox.BucketID and the ticks of package schedule do:
// "20060102T150405Z", or with millis "20060102T150405.000Z" (t is cut to the
// second, or to the millisecond). Ids written with the same millis sort in time
// order.
func TimeID(t time.Time, millis bool) string {
	t = t.UTC()
	if millis {
		return t.Truncate(time.Millisecond).Format("20060102T150405.000Z")
	}
	return t.Truncate(time.Second).Format("20060102T150405Z")
}
