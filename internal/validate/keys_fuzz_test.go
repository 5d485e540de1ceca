package validate

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

// FuzzConcurrencyKey checks ConcurrencyKey against its documented rule, written
// apart ("" or at most 200 bytes of UTF-8 without a control character), and
// that a refusal wraps its sentinels in one printable line.
func FuzzConcurrencyKey(f *testing.F) {
	for _, s := range []string{"", "tenant-42", "acct:7/eu", "é", "日本", "a\tb", "x\n{evil}\x1b[2J", "\x7f", "\u0085",
		"\xff", strings.Repeat("k", 200), strings.Repeat("k", 201), strings.Repeat("é", 100), strings.Repeat("é", 101) + "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want := len(s) <= 200 && utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0
		err := ConcurrencyKey(s)
		if (err == nil) != want {
			t.Fatalf("ConcurrencyKey(%q) = %v, the rule says valid=%v", s, err, want)
		}
		if err == nil {
			return
		}
		if !errors.Is(err, ErrInvalidConcurrencyKey) || !errors.Is(err, ErrInvalidTask) {
			t.Fatalf("ConcurrencyKey(%q) = %v: not its sentinels", s, err)
		}
		msg := err.Error()
		if len(msg) > 200 || strings.IndexFunc(msg, func(r rune) bool { return unicode.IsControl(r) || r == utf8.RuneError }) >= 0 {
			t.Fatalf("ConcurrencyKey(%q): message %q is long or not printable", s, msg)
		}
	})
}

// FuzzKeyLimits checks KeyLimits against its documented bounds.
func FuzzKeyLimits(f *testing.F) {
	for _, c := range []struct {
		conc, thr int
		win       int64
	}{{0, 0, 0}, {1, 0, 0}, {100000, 0, 0}, {100001, 0, 0}, {-1, 0, 0}, {0, 1, int64(time.Millisecond)},
		{0, 10000, int64(24 * time.Hour)}, {0, 10001, int64(time.Second)}, {0, 5, int64(time.Microsecond)},
		{0, 5, int64(1500 * time.Microsecond)}, {0, 5, int64(24*time.Hour + time.Millisecond)}, {2, -3, 0}} {
		f.Add(c.conc, c.thr, c.win)
	}
	f.Fuzz(func(t *testing.T, conc, thr int, win int64) {
		w := time.Duration(win)
		want := conc >= 0 && conc <= 100000 && thr >= 0 && thr <= 10000 &&
			(thr == 0 || (w >= time.Millisecond && w <= 24*time.Hour && w%time.Millisecond == 0))
		err := KeyLimits(conc, thr, w)
		if (err == nil) != want {
			t.Fatalf("KeyLimits(%d, %d, %v) = %v, the bounds say valid=%v", conc, thr, w, err, want)
		}
		if err != nil && !errors.Is(err, ErrInvalidKeyLimits) {
			t.Fatalf("KeyLimits(%d, %d, %v) = %v: not ErrInvalidKeyLimits", conc, thr, w, err)
		}
	})
}
