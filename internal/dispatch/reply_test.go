package dispatch

import (
	"errors"
	"testing"
	"time"
)

// decodeReply builds a script reply (int64, string, nil, []any) from fuzz bytes:
// op byte 0 int64 (next 2 bytes, signed), 1 string (length byte, then bytes),
// 2 nil, 3 array (count byte, then elements), anything else a short ASCII number.
func decodeReply(data []byte) any {
	v, _ := decodeAt(data, 0)
	return v
}

func decodeAt(d []byte, depth int) (any, []byte) {
	if len(d) == 0 {
		return nil, d
	}
	op, d := d[0], d[1:]
	switch op % 5 {
	case 0:
		if len(d) < 2 {
			return int64(0), nil
		}
		return int64(int16(uint16(d[0])<<8 | uint16(d[1]))), d[2:]
	case 1:
		if len(d) == 0 {
			return "", d
		}
		n := min(int(d[0]), len(d)-1)
		return string(d[1 : 1+n]), d[1+n:]
	case 2:
		return nil, d
	case 3:
		if len(d) == 0 || depth > 3 {
			return []any{}, d
		}
		n := int(d[0])
		d = d[1:]
		out := make([]any, 0, n)
		for i := 0; i < n && len(d) > 0; i++ {
			var v any
			v, d = decodeAt(d, depth+1)
			out = append(out, v)
		}
		return out, d
	default:
		if len(d) == 0 {
			return "1700000000.125", d
		}
		return []string{"0", "-1", "1700000000.125", "", "x", "1e400", "NaN"}[int(d[0])%7], d[1:]
	}
}

// encodeReply is the inverse of decodeReply, to seed the fuzzers with real shapes.
func encodeReply(v any) []byte {
	switch x := v.(type) {
	case int64:
		return []byte{0, byte(uint16(x) >> 8), byte(x)}
	case string:
		return append([]byte{1, byte(len(x))}, x...)
	case nil:
		return []byte{2}
	case []any:
		out := []byte{3, byte(len(x))}
		for _, e := range x {
			out = append(out, encodeReply(e)...)
		}
		return out
	}
	panic("unsupported")
}

var validReplies = []any{
	[]any{int64(1), int64(0), int64(2)}, // enqueue
	[]any{int64(-1), "1700000000.000", "1700000060.000", int64(1), int64(0), int64(0), "1699999999.800",
		"id1", "payload", int64(1), int64(25), int64(1), "tok.1", "1699999999.500", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""}, // claim
	[]any{int64(250), "1700000000.000", "1700000060.000", int64(0), int64(0), int64(0), ""}, // claim, nothing due
	[]any{"1700000060.123", int64(1), int64(0)},                                             // extend, two leases: renewed, lost
	int64(0), // a status
	[]any{[]any{"a"}, []any{"b", "c"}, []any{}},                                                                         // reap
	[]any{int64(3), int64(1), int64(2), int64(0), int64(1), "1700000000.000", "1699999990.000"},                         // stats
	[]any{"r", "p", "", "25", "1", "", "1700000000.1229999", int64(-1), "7", "", "", "", "", "", "", "", int64(-2), ""}, // inspect 2 ids
	[]any{int64(0), "1700000000.000", "1700000060.000", int64(0), int64(7), int64(0), ""},                               // claim, rate limited
	[]any{int64(0), "1700000000.000", "1700000060.000", int64(2), int64(0), int64(0), "1699999999.000",
		"a", "p", int64(1), int64(25), int64(1), "tok.1", "1699999999.500", "", "1699999999.999",
		"b", "p", int64(1), int64(25), int64(1), "tok.2", "1699999999.500", "", "1700000000.000"}, // claim, deadlines
}

func FuzzParseReplies(f *testing.F) {
	for _, v := range validReplies {
		f.Add(encodeReply(v), uint8(2))
	}
	f.Fuzz(func(t *testing.T, data []byte, n uint8) {
		v := decodeReply(data)
		if st, err := parseEnqueue(v, int(n)); err == nil && len(st) != int(n) {
			t.Fatalf("parseEnqueue: %d statuses for %d", len(st), n)
		}
		if c, err := parseClaim(v, "q"); err == nil {
			for i, task := range c.Tasks {
				if task.Queue != "q" {
					t.Fatal("queue not set")
				}
				// The trace context is the group's eighth field, as sent.
				if got := v.([]any)[claimHead+i*claimGroup+7]; got != task.TraceContext {
					t.Fatalf("task %d: trace context %q, reply field %#v", i, task.TraceContext, got)
				}
			}
		} else if !errors.Is(err, ErrUnexpectedReply) {
			t.Fatalf("parseClaim: %v", err)
		}
		if r, err := parseExtend(nil, v, int(n)); err == nil && len(r) != int(n) {
			t.Fatalf("parseExtend: %d codes for %d", len(r), n)
		}
		_, _ = parseCode(v, "x", 0, 1)
		_, _ = parseReap(v)
		if s, err := parseStats(v); err == nil && s.OldestLateness < 0 {
			t.Fatal("negative lateness")
		}
		_, _ = parseInspect(v, []string{"a", "b"})
	})
}

func TestParseValidReplies(t *testing.T) {
	t.Parallel()
	for i, v := range validReplies {
		if got := decodeReply(encodeReply(v)); !equalReply(got, v) {
			t.Errorf("reply %d does not round-trip: %#v", i, got)
		}
	}
	st, err := parseEnqueue(validReplies[0], 3)
	if err != nil || st[0] != Added || st[1] != Duplicate || st[2] != Replaced {
		t.Errorf("enqueue %v %v", st, err)
	}
	c, err := parseClaim(validReplies[1], "q")
	if err != nil || c.NextDue != -1 || len(c.Tasks) != 1 || c.Tasks[0].Token != "tok.1" ||
		c.Tasks[0].TraceContext != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" ||
		!c.Tasks[0].Due.Equal(time.UnixMilli(1699999999500)) || !c.Tasks[0].LeaseUntil.Equal(time.Unix(1700000060, 0)) {
		t.Errorf("claim %+v %v", c, err)
	}
	// The queue resumed after the task fell due: its lateness counts from the resume.
	if !c.Tasks[0].Resumed.Equal(time.UnixMilli(1699999999800)) {
		t.Errorf("claim after a resume: Resumed %v", c.Tasks[0].Resumed)
	}
	if c, err := parseClaim(validReplies[2], "q"); err != nil || c.NextDue != 250*time.Millisecond || c.Tasks != nil {
		t.Errorf("empty claim %+v %v", c, err)
	}
	if c, err := parseClaim(validReplies[8], "q"); err != nil || c.NextDue != 0 || c.RateWait != 7*time.Millisecond {
		t.Errorf("rate-limited claim %+v %v", c, err)
	}
	if c, err := parseClaim(validReplies[9], "q"); err != nil || len(c.Tasks) != 2 || !c.Tasks[0].Missed || c.Tasks[1].Missed ||
		c.Tasks[0].StartBy.UnixMilli() != 1699999999999 || c.Tasks[1].StartBy.UnixMilli() != 1700000000000 {
		t.Errorf("claim with deadlines %+v %v: a deadline before now is missed, one at now is not", c, err)
	} else if !c.Tasks[0].Resumed.IsZero() {
		t.Errorf("a resume before the task fell due set Resumed %v", c.Tasks[0].Resumed)
	}
	if r, err := parseExtend([]bool{true}, validReplies[3], 2); err != nil || len(r) != 3 || !r[0] || !r[1] || r[2] {
		t.Errorf("extend %v %v", r, err)
	}
	r, err := parseReap(validReplies[5])
	if err != nil || len(r.Requeued) != 1 || len(r.Exhausted) != 2 || r.Orphans != nil {
		t.Errorf("reap %+v %v", r, err)
	}
	s, err := parseStats(validReplies[6])
	if err != nil || s.Ready != 3 || s.OldestLateness != 10*time.Second {
		t.Errorf("stats %+v %v", s, err)
	}
	ti, err := parseInspect(validReplies[7], []string{"a", "b"})
	if err != nil || ti[0].State != StateReady || ti[0].MaxAttempts != 25 || ti[0].Score.UnixMilli() != 1700000000123 ||
		ti[0].Priority != 7 || ti[1].State != StateMissing || ti[1].Priority != 0 {
		t.Errorf("inspect %+v %v", ti, err)
	}
}

func TestParseMalformedReplies(t *testing.T) {
	t.Parallel()
	bad := []struct {
		name  string
		parse func() error
	}{
		{"enqueue not array", func() error { _, err := parseEnqueue("x", 1); return err }},
		{"enqueue count", func() error { _, err := parseEnqueue([]any{int64(1)}, 2); return err }},
		{"enqueue code", func() error { _, err := parseEnqueue([]any{int64(7)}, 1); return err }},
		{"claim short", func() error { _, err := parseClaim([]any{int64(1)}, "q"); return err }},
		{"claim trace", func() error {
			_, err := parseClaim([]any{int64(-1), "1.0", "2.0", int64(1), int64(0), int64(0), "", "id", "p", int64(1), int64(25), int64(1), "t.1", "1.0", int64(7)}, "q")
			return err
		}},
		{"claim group of 7", func() error {
			_, err := parseClaim([]any{int64(-1), "1.0", "2.0", int64(1), int64(0), int64(0), "", "id", "p", int64(1), int64(25), int64(1), "t.1", "1.0"}, "q")
			return err
		}},
		{"claim count", func() error {
			_, err := parseClaim([]any{int64(1), "1.0", "2.0", int64(2), int64(0), int64(0), "", "id"}, "q")
			return err
		}},
		{"claim next", func() error {
			_, err := parseClaim([]any{int64(-5), "1.0", "2.0", int64(0), int64(0), int64(0), ""}, "q")
			return err
		}},
		{"claim shards", func() error {
			_, err := parseClaim([]any{int64(1), "1.0", "2.0", int64(0), int64(0), int64(65), ""}, "q")
			return err
		}},
		{"claim score", func() error {
			_, err := parseClaim([]any{int64(1), "NaN", "2.0", int64(0), int64(0), int64(0), ""}, "q")
			return err
		}},
		{"claim resumed", func() error {
			_, err := parseClaim([]any{int64(1), "1.0", "2.0", int64(0), int64(0), int64(0), "NaN"}, "q")
			return err
		}},
		{"extend type", func() error { _, err := parseExtend(nil, int64(0), 1); return err }},
		{"extend count", func() error { _, err := parseExtend(nil, []any{"1700000060.123", int64(1)}, 2); return err }},
		{"extend deadline", func() error { _, err := parseExtend(nil, []any{"NaN", int64(1)}, 1); return err }},
		{"extend code", func() error { _, err := parseExtend(nil, []any{"1700000060.123", int64(3)}, 1); return err }},
		{"code", func() error { _, err := parseCode(int64(9), "x", 0, 1); return err }},
		{"reap shape", func() error { _, err := parseReap([]any{[]any{}}); return err }},
		{"reap id", func() error { _, err := parseReap([]any{[]any{int64(1)}, []any{}, []any{}}); return err }},
		{"stats", func() error { _, err := parseStats([]any{int64(1)}); return err }},
		{"inspect status", func() error {
			_, err := parseInspect([]any{"?", "", "", "", "", "", "", int64(-2), ""}, []string{"a"})
			return err
		}},
		{"inspect number", func() error {
			_, err := parseInspect([]any{"r", "", "x", "", "", "", "", int64(-2), ""}, []string{"a"})
			return err
		}},
	}
	for _, tc := range bad {
		if err := tc.parse(); !errors.Is(err, ErrUnexpectedReply) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func equalReply(a, b any) bool {
	switch x := a.(type) {
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equalReply(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	return a == b
}
