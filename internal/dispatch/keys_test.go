package dispatch

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/validate"
)

func TestKeysFor(t *testing.T) {
	t.Parallel()
	k, err := KeysFor("dq", "payment")
	if err != nil {
		t.Fatal(err)
	}
	want := Keys{
		Ready:      "dq:{payment}:ready",
		Active:     "dq:{payment}:active",
		Dead:       "dq:{payment}:dead",
		Priority:   "dq:{payment}:prio",
		TaskPrefix: "dq:{payment}:t:",
		Control:    "dq:{payment}:ctl",
		History:    "dq:{payment}:h:",
		KeyPrefix:  "dq:{payment}:k:",
		Wake:       "dq:{payment}:wake",
	}
	if k != want {
		t.Errorf("KeysFor = %+v", k)
	}
	if got := k.TaskKey("order-1001"); got != "dq:{payment}:t:order-1001" {
		t.Errorf("TaskKey = %q", got)
	}
	for _, tc := range []struct {
		prefix, queue string
		want          error
	}{
		{"", "q", ErrInvalidPrefix},
		{"a{", "q", ErrInvalidPrefix},
		{"dq", "", ErrInvalidQueue},
		{"dq", "a}b", ErrInvalidQueue},
		{"dq", "a:b", ErrInvalidQueue},
	} {
		if _, err := KeysFor(tc.prefix, tc.queue); !errors.Is(err, tc.want) {
			t.Errorf("KeysFor(%q, %q): %v, want %v", tc.prefix, tc.queue, err, tc.want)
		}
	}
}

func TestHashTag(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]string{
		"dq:{payment}:ready": "payment",
		"plain":              "plain",
		"a{}b{c}":            "a{}b{c}",
		"a{b":                "a{b",
		"x{y}z{w}":           "y",
	} {
		if got := hashTag(key); got != want {
			t.Errorf("hashTag(%q) = %q, want %q", key, got, want)
		}
	}
}

// keysForTask builds the keys of queue, validating the task id as well.
func keysForTask(prefix, queue, id string) (Keys, error) {
	k, err := KeysFor(prefix, queue)
	if err != nil {
		return Keys{}, err
	}
	return k, validate.TaskID(id)
}

// FuzzKeys: for any accepted prefix, queue and id, every key of the queue hashes to
// the queue's slot (the queue is the hash tag), and a task key is its prefix + id.
func FuzzKeys(f *testing.F) {
	f.Add("dq", "payment", "order-1001")
	f.Add("a:b", "q.1-x_y", "x:{y}")
	f.Add("dq", "q", "}{")
	f.Fuzz(func(t *testing.T, prefix, queue, id string) {
		k, err := keysForTask(prefix, queue, id)
		if err != nil {
			if !errors.Is(err, ErrInvalidPrefix) && !errors.Is(err, ErrInvalidQueue) && !errors.Is(err, ErrInvalidTaskID) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		tk := k.TaskKey(id)
		for _, key := range []string{k.Ready, k.Active, k.Dead, k.Wake, tk} {
			if got := hashTag(key); got != queue {
				t.Fatalf("key %q hashes on %q, not on queue %q", key, got, queue)
			}
			if !strings.HasPrefix(key, prefix+":{"+queue+"}:") {
				t.Fatalf("key %q outside the queue's namespace", key)
			}
		}
		if strings.TrimPrefix(tk, k.TaskPrefix) != id {
			t.Fatalf("task key %q does not end with id %q", tk, id)
		}
		if strings.ContainsAny(id, "{}") || strings.ContainsAny(queue, "{}:") {
			t.Fatalf("validation let braces through: %q %q", queue, id)
		}
		// The id's shard in a queue of 2..MaxShards shards (a number from the id):
		// every key of it on one slot, and the key read back as the queue's.
		n := 2 + len(id)%(MaxShards-1)
		sk, err := ShardKeys(prefix, queue, ShardOf(id, n), n)
		if err != nil {
			t.Fatal(err)
		}
		tag := hashTag(sk.Ready)
		c := &Client{cfg: Config{Prefix: prefix}}
		for _, key := range []string{sk.Ready, sk.Active, sk.Dead, sk.Priority, sk.Control, sk.TaskKey(id)} {
			if got := hashTag(key); got != tag {
				t.Fatalf("shard key %q hashes on %q, not on %q", key, got, tag)
			}
			if q, ok := c.queueOf(key); !ok || q != queue {
				t.Fatalf("shard key %q read back as queue %q, %v", key, q, ok)
			}
		}
	})
}

// TestFormatScoreRoundsUp: a due time between two milliseconds becomes the later
// one, so a task is never claimed before the time it was given.
func TestFormatScoreRoundsUp(t *testing.T) {
	t.Parallel()
	base := time.UnixMilli(1_700_000_000_123)
	for _, c := range []struct {
		in   time.Time
		want string
	}{
		{base, "1700000000.123"},
		{base.Add(time.Microsecond), "1700000000.124"},
		{base.Add(999 * time.Microsecond), "1700000000.124"},
		{base.Add(time.Millisecond), "1700000000.124"},
	} {
		if got := formatScore(c.in); got != c.want {
			t.Errorf("formatScore(%v) = %s, want %s", c.in, got, c.want)
		}
	}
}
