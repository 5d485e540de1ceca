package schedspec

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestRunKey(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 5, 1, 23, 45, 678e6, time.FixedZone("X", 3600))
	key := NewRunKey(at)
	if !strings.HasPrefix(key, "20261205T002345Z-") || len(key) != 16+1+16 {
		t.Fatalf("NewRunKey = %q", key)
	}
	if NewRunKey(at) == key {
		t.Fatal("two keys of the same second are equal")
	}
	got, err := ParseRunKey(key)
	if err != nil || !got.Equal(at.Truncate(time.Second)) {
		t.Fatalf("ParseRunKey(%q) = %v %v", key, got, err)
	}
	id := RunID("nightly", key)
	if id != "nightly@run-"+key {
		t.Fatalf("RunID = %q", id)
	}
	if k, when, ok := ParseRunID(strings.TrimPrefix(id, "nightly@")); !ok || k != key || !when.Equal(got) {
		t.Fatalf("ParseRunID: %q %v %v", k, when, ok)
	}
	for _, bad := range []string{"", "-", "20261205T002345Z", "20261205T002345Z-", "20261205T002345Z-ABC",
		"20261205T002345Z-a b", "2026-12-05-abc", "20261205T002345Z-" + strings.Repeat("a", 33), "20261205T002345.000Z-abc"} {
		if _, err := ParseRunKey(bad); !errors.Is(err, ErrRunKey) {
			t.Errorf("ParseRunKey(%q): %v", bad, err)
		}
	}
	// A tick's time is not a run.
	if _, _, ok := ParseRunID("20261205T002345Z"); ok {
		t.Error("a tick's id read as a run")
	}
}

func FuzzParseRunKey(f *testing.F) {
	f.Add("20261205T002345Z-9f8e7d6c5b4a3921")
	f.Add("x-y")
	f.Fuzz(func(t *testing.T, key string) {
		at, err := ParseRunKey(key)
		if err != nil {
			return
		}
		// A valid key names a valid task id and reads back.
		id := RunID("s", key)
		for i := 0; i < len(id); i++ {
			if c := id[i]; c < 0x21 || c > 0x7e || c == '{' || c == '}' {
				t.Fatalf("RunID(%q) has byte %q", key, c)
			}
		}
		if k, when, ok := ParseRunID(strings.TrimPrefix(id, "s@")); !ok || k != key || !when.Equal(at) {
			t.Fatalf("round trip of %q: %q %v %v", key, k, when, ok)
		}
	})
}
