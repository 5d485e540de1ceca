package validate

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// The documented rules, written independently of the validators.
var (
	queueRule  = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
	taskIDRule = regexp.MustCompile(`^[\x21-\x7a\x7c\x7e]{1,200}$`) // printable ASCII but '{' (0x7b) and '}' (0x7d)
	prefixRule = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)
	dbRule     = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)
)

// FuzzIdentifiers checks each validator against its documented rule in both
// directions (it accepts exactly what the rule allows), and that a refusal wraps
// its own sentinel with a short, single-line message without control characters,
// safe to log whatever the input was.
func FuzzIdentifiers(f *testing.F) {
	for _, s := range []string{"payment", "order-1001", "a:b", "{x}", "", "a b", "é", "x\n{evil}\x1b[2J",
		strings.Repeat("q", 64), strings.Repeat("q", 65), strings.Repeat("i", 200), strings.Repeat("i", 201), "\x00", "~|"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, c := range []struct {
			name     string
			check    func(string) error
			rule     *regexp.Regexp
			sentinel error
		}{
			{"Queue", Queue, queueRule, ErrInvalidQueue},
			{"TaskID", TaskID, taskIDRule, ErrInvalidTaskID},
			{"Prefix", Prefix, prefixRule, ErrInvalidPrefix},
			{"Database", Database, dbRule, ErrInvalidDatabase},
		} {
			err := c.check(s)
			if want := c.rule.MatchString(s); (err == nil) != want {
				t.Fatalf("%s(%q) = %v, the rule says valid=%v", c.name, s, err, want)
			}
			if err == nil {
				continue
			}
			n := 0
			for _, sent := range []error{ErrInvalidQueue, ErrInvalidTaskID, ErrInvalidPrefix, ErrInvalidDatabase} {
				if errors.Is(err, sent) {
					n++
				}
			}
			if !errors.Is(err, c.sentinel) || n != 1 {
				t.Fatalf("%s(%q): %v wraps %d sentinels, want only %v", c.name, s, err, n, c.sentinel)
			}
			msg := err.Error()
			if len(msg) > 400 {
				t.Fatalf("%s: message of %d bytes", c.name, len(msg))
			}
			if strings.IndexFunc(msg, func(r rune) bool { return unicode.IsControl(r) || r == unicode.ReplacementChar }) >= 0 {
				t.Fatalf("%s(%q): message %q holds a control character", c.name, s, msg)
			}
		}
	})
}
