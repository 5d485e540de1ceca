package validate

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestQueue(t *testing.T) {
	t.Parallel()
	good := []string{"payment", "a", "Q.1_x-y", strings.Repeat("q", MaxQueueLen)}
	for _, q := range good {
		if err := Queue(q); err != nil {
			t.Errorf("Queue(%q) = %v, want nil", q, err)
		}
	}
	bad := []string{"", "pay{ment}", "a:b", "a b", "ü", strings.Repeat("q", MaxQueueLen+1), "x}", "new\nline"}
	for _, q := range bad {
		if err := Queue(q); !errors.Is(err, ErrInvalidQueue) {
			t.Errorf("Queue(%q) = %v, want ErrInvalidQueue", q, err)
		}
	}
}

func TestTaskID(t *testing.T) {
	t.Parallel()
	good := []string{"order-1001", "payment:order-1001", "a/b?c=d", strings.Repeat("x", MaxTaskIDLen)}
	for _, id := range good {
		if err := TaskID(id); err != nil {
			t.Errorf("TaskID(%q) = %v, want nil", id, err)
		}
	}
	bad := []string{"", "a b", "{q}", "x}", "tab\t", "ü", "nul\x00", strings.Repeat("x", MaxTaskIDLen+1)}
	for _, id := range bad {
		if err := TaskID(id); !errors.Is(err, ErrInvalidTaskID) {
			t.Errorf("TaskID(%q) = %v, want ErrInvalidTaskID", id, err)
		}
	}
}

func TestPrefix(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"dq", "app:dq", "t-1.x"} {
		if err := Prefix(p); err != nil {
			t.Errorf("Prefix(%q) = %v", p, err)
		}
	}
	for _, p := range []string{"", "{dq}", "a b", strings.Repeat("p", MaxPrefixLen+1)} {
		if err := Prefix(p); !errors.Is(err, ErrInvalidPrefix) {
			t.Errorf("Prefix(%q) = %v, want ErrInvalidPrefix", p, err)
		}
	}
}

// FuzzTaskID checks that an accepted id can never carry a hash-tag brace or
// whitespace, whatever the input.
func FuzzTaskID(f *testing.F) {
	for _, s := range []string{"order-1", "{x}", "a b", "", "payment:order-1001"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if TaskID(id) != nil {
			return
		}
		if id == "" || len(id) > MaxTaskIDLen || strings.ContainsAny(id, "{} \t\r\n") {
			t.Fatalf("accepted unsafe id %q", id)
		}
	})
}

func FuzzQueue(f *testing.F) {
	for _, s := range []string{"payment", "{x}", "a:b", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		if Queue(q) != nil {
			return
		}
		if q == "" || len(q) > MaxQueueLen || strings.ContainsAny(q, "{}: \t\r\n") {
			t.Fatalf("accepted unsafe queue %q", q)
		}
	})
}

func BenchmarkTaskID(b *testing.B) {
	for b.Loop() {
		if err := TaskID("payment:order-1001"); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRateBoundsAgree: the bounds here are delayqtype.RateLimit.Validate's.
func TestRateBoundsAgree(t *testing.T) {
	ok := []RateLimit{{Limit: MaxRateLimit, Period: time.Second, Burst: MaxRateBurst}, {Limit: 1, Period: MaxRatePeriod, Burst: 1}}
	bad := []RateLimit{{Limit: MaxRateLimit + 1, Period: time.Second, Burst: 1}, {Limit: 1, Period: time.Second, Burst: MaxRateBurst + 1},
		{Limit: 1, Period: MaxRatePeriod + time.Millisecond, Burst: 1}}
	for _, r := range ok {
		if err := r.Validate(); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
	for _, r := range bad {
		if err := r.Validate(); err == nil {
			t.Errorf("%+v accepted", r)
		}
	}
	if got := (RateLimit{Limit: 1000, Period: time.Second}).WithDefaults().Burst; got != int(1000*DefaultBurstWindow/time.Second) {
		t.Errorf("default burst %d, want DefaultBurstWindow's worth", got)
	}
}
