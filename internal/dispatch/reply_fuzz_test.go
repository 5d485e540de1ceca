package dispatch

import (
	"errors"
	"strconv"
	"testing"
	"time"
)

// FuzzParseProbe covers the probe reply (reconcile's read), which FuzzParseReplies
// does not: any shape gives probes that match the ids, or ErrUnexpectedReply.
func FuzzParseProbe(f *testing.F) {
	valid := []any{
		[]any{"1700000000.000",
			"r", "1", "0", "25", "1699999999.500", "", "", "fp1",
			"", "", "", "", "", "", "", ""},
		[]any{"1700000000.000",
			"a", "2", "3", "25", "", "1700000060.000", "", "fp2",
			"x", "", "25", "25", "", "", "1699999000.1229999", "fp3"},
	}
	for _, v := range valid {
		f.Add(encodeReply(v), uint8(2))
	}
	f.Add(encodeReply([]any{"1700000000.000", "?", "", "", "", "", "", "", ""}), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, n uint8) {
		ids := make([]string, int(n%4))
		for i := range ids {
			ids[i] = "id" + strconv.Itoa(i)
		}
		now, probes, err := parseProbe(decodeReply(data), ids)
		if err != nil {
			if !errors.Is(err, ErrUnexpectedReply) {
				t.Fatalf("parseProbe: %v does not wrap ErrUnexpectedReply", err)
			}
			return
		}
		if now.UnixMilli() < 0 {
			t.Fatalf("now %v before 1970", now)
		}
		if len(probes) != len(ids) {
			t.Fatalf("%d probes for %d ids", len(probes), len(ids))
		}
		for i, p := range probes {
			if p.ID != ids[i] {
				t.Fatalf("probe %d has id %q, want %q", i, p.ID, ids[i])
			}
			switch p.State {
			case StateMissing, StateReady, StateActive, StateDone, StateDead:
			default:
				t.Fatalf("probe %d: state %q", i, p.State)
			}
			for _, z := range []struct {
				in bool
				at time.Time
			}{{p.InReady, p.ReadyScore}, {p.InActive, p.ActiveScore}, {p.InDead, p.DeadScore}} {
				if !z.in && !z.at.IsZero() {
					t.Fatalf("probe %d: a score without membership: %+v", i, p)
				}
			}
		}
	})
}

// FuzzScoreRoundTrip: every time an enqueue accepts (0..1e14 ms since 1970) comes
// back from a ZSET score exactly, to the millisecond, both as written and as Redis
// prints a double back (%.17g, with binary noise such as "…0.1229999").
func FuzzScoreRoundTrip(f *testing.F) {
	for _, ms := range []int64{0, 1, 999, 1000, 1700000000123, 1700000000999, 253402300799999, 1e14} {
		f.Add(ms)
	}
	f.Fuzz(func(t *testing.T, ms int64) {
		if ms < 0 || ms > 1e14 {
			return // checkTask refuses these
		}
		want := time.UnixMilli(ms)
		s := formatScore(want)
		got, err := parseScore(s)
		if err != nil || !got.Equal(want) {
			t.Fatalf("%d ms: formatScore %q parses back as %v (%v)", ms, s, got, err)
		}
		fl, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("score %q: %v", s, err)
		}
		printed := strconv.FormatFloat(fl, 'g', 17, 64)
		if got, err := parseScore(printed); err != nil || !got.Equal(want) {
			t.Fatalf("%d ms: score %q printed by Redis as %q parses back as %v (%v)", ms, s, printed, got, err)
		}
	})
}
