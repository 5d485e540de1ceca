package delayq

import (
	"context"
	"testing"
	"time"
)

// Claim coalescing: without a backlog a free slot is claimed at once however long
// the coalescing window; with one, the wait ends as soon as a quarter of the slots
// is free, or when the window ends with what is free then.
func TestQueueSlotsCoalesce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	held := func(s *queueSlots, n int) {
		t.Helper()
		if got := s.takeFree(n); got != n {
			t.Fatalf("took %d of %d free slots", got, n)
		}
	}

	t.Run("a due task is not held back", func(t *testing.T) {
		t.Parallel()
		s := newQueueSlots(16, time.Hour) // a window that would hang the test
		defer s.close()
		held(s, 15)
		if n := s.take(ctx, false); n != 1 {
			t.Errorf("took %d slots, want the one free", n)
		}
		// With a backlog but a quarter free already, no wait either.
		s.free(4)
		if n := s.take(ctx, true); n != 4 {
			t.Errorf("took %d slots, want the 4 free", n)
		}
	})

	t.Run("the wait ends at a quarter", func(t *testing.T) {
		t.Parallel()
		s := newQueueSlots(16, time.Hour)
		defer s.close()
		held(s, 15)
		go s.free(3) // runs ending while the claim waits
		if n := s.take(ctx, true); n != 4 {
			t.Errorf("took %d slots, want a quarter of 16", n)
		}
	})

	t.Run("the wait is bounded", func(t *testing.T) {
		t.Parallel()
		s := newQueueSlots(16, time.Millisecond)
		defer s.close()
		held(s, 15)
		for range 3 { // the reused timer starts afresh each time
			if n := s.take(ctx, true); n != 1 {
				t.Fatalf("took %d slots, want the one free after the window", n)
			}
			s.free(1)
		}
	})

	t.Run("shutdown", func(t *testing.T) {
		t.Parallel()
		s := newQueueSlots(4, time.Hour)
		defer s.close()
		held(s, 4)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if n := s.take(cctx, true); n != 0 {
			t.Errorf("took %d slots after ctx was done", n)
		}
	})
}
