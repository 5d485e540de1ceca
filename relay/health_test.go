package relay

import (
	"testing"
	"time"
)

func TestBackoffBounds(t *testing.T) {
	t.Parallel()
	b := newBackoff(100*time.Millisecond, time.Second)
	for i := range 50 {
		d := b.next()
		hi := min(time.Second, 100*time.Millisecond<<min(i, 20))
		if d < hi/2 || d > hi {
			t.Fatalf("delay %d = %v, want in [%v, %v]", i, d, hi/2, hi)
		}
	}
	b.reset()
	if d := b.next(); d > 100*time.Millisecond {
		t.Errorf("after reset: %v", d)
	}
}
