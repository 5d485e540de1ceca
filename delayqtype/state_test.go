package delayqtype

import (
	"errors"
	"testing"
)

// Every state parses back from its name and is live or finished, never both,
// but waiting, which is neither (it has to run, but not yet: the relay leaves it
// alone); another name is ErrUnknownState.
func TestStates(t *testing.T) {
	t.Parallel()
	for _, s := range States() {
		got, err := ParseState(string(s))
		if err != nil || got != s {
			t.Errorf("ParseState(%q) = %q, %v", s, got, err)
		}
		if s == StateWaiting {
			if s.Live() || s.Finished() {
				t.Errorf("%s: live %v, finished %v", s, s.Live(), s.Finished())
			}
			continue
		}
		if s.Live() == s.Finished() {
			t.Errorf("%s: live %v, finished %v", s, s.Live(), s.Finished())
		}
	}
	for _, bad := range []string{"", "Pending", "active", "ready"} {
		if _, err := ParseState(bad); !errors.Is(err, ErrUnknownState) {
			t.Errorf("ParseState(%q): %v, want ErrUnknownState", bad, err)
		}
	}
}
