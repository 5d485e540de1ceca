package delayq

import (
	"testing"
	"time"
)

func TestApproach(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ d, want time.Duration }{
		{-1, -1}, // empty queue: the Waiter's MaxWait
		{time.Millisecond, time.Millisecond},
		{3 * time.Millisecond, 3 * time.Millisecond},
		{4 * time.Millisecond, 2 * time.Millisecond},
		{12 * time.Millisecond, 10 * time.Millisecond},
		{13 * time.Millisecond, 3 * time.Millisecond},
		{60 * time.Millisecond, 50 * time.Millisecond},
		{61 * time.Millisecond, 11 * time.Millisecond},
		{time.Hour, time.Hour - 50*time.Millisecond},
	} {
		if got := approach(c.d); got != c.want {
			t.Errorf("approach(%v) = %v, want %v", c.d, got, c.want)
		}
	}
	// However long the wait, the claims it costs before the due time are at most
	// three, and no wait is empty or ends after the due time.
	for d := time.Millisecond; d < 2*time.Second; d += 37 * time.Microsecond {
		left, claims := d, 0
		for left > 0 {
			w := approach(left)
			if w <= 0 || w > left {
				t.Fatalf("approach(%v) = %v", left, w)
			}
			left -= w
			if left > 0 {
				claims++
			}
		}
		if claims > 3 {
			t.Fatalf("a wait of %v costs %d early claims", d, claims)
		}
	}
}
