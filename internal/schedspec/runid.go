package schedspec

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
)

// A manual run of a schedule (delayq schedules run, the dashboard's run now) is a
// task whose id is the schedule's name, "@run-" and the run's key:
// "nightly-report@run-20261205T012345Z-9f8e7d6c5b4a3921". The key is the time the
// run was asked for, to the second in UTC, and a nonce; it travels with the
// request (the dashboard's form holds it), so that the same request sent twice
// names the same task, and the outbox's unique key makes it one task. A tick's id
// ("nightly-report@20261205T010000Z") never starts its time with "run-".

// runPrefix marks a manual run's id after the schedule's name and '@'.
const runPrefix = "run-"

// runTimeLayout is the time of a run key.
const runTimeLayout = "20060102T150405Z"

// ErrRunKey reports a run key that is not one NewRunKey writes.
var ErrRunKey = errors.New("invalid run key")

// NewRunKey returns a fresh run key for a run asked for at t: t to the second
// and 64 random bits in hex.
func NewRunKey(t time.Time) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	return t.UTC().Format(runTimeLayout) + "-" + hex.EncodeToString(b[:])
}

// ParseRunKey checks a run key and returns the time it was asked for: the time
// as NewRunKey writes it, '-', and a nonce of 1..32 bytes of [0-9a-z].
func ParseRunKey(key string) (time.Time, error) {
	ts, nonce, ok := strings.Cut(key, "-")
	if !ok || nonce == "" || len(nonce) > 32 {
		return time.Time{}, fmt.Errorf("%w %q: want <time>-<nonce> (20261205T012345Z-9f8e7d6c5b4a3921)", ErrRunKey, short(key))
	}
	for i := 0; i < len(nonce); i++ {
		if c := nonce[i]; (c < '0' || c > '9') && (c < 'a' || c > 'z') {
			return time.Time{}, fmt.Errorf("%w %q: the nonce is [0-9a-z]", ErrRunKey, short(key))
		}
	}
	t, err := time.Parse(runTimeLayout, ts)
	if err != nil || t.Format(runTimeLayout) != ts { // no fraction: the time as written
		return time.Time{}, fmt.Errorf("%w %q: the time is %s", ErrRunKey, short(key), runTimeLayout)
	}
	return t, nil
}

// short cuts a key for a message.
func short(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// RunID is the task id of the manual run of the schedule name with key (valid
// by ParseRunKey).
func RunID(name, key string) string { return name + "@" + runPrefix + key }

// ParseRunID reads the part of a task id after the schedule's name and '@': a
// manual run's key and the time it was asked for; ok is false for anything else.
func ParseRunID(after string) (key string, at time.Time, ok bool) {
	key, ok = strings.CutPrefix(after, runPrefix)
	if !ok {
		return "", time.Time{}, false
	}
	at, err := ParseRunKey(key)
	if err != nil {
		return "", time.Time{}, false
	}
	return key, at, true
}
