package delayq

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestRunners(t *testing.T) {
	t.Parallel()
	t.Run("reuse", func(t *testing.T) {
		t.Parallel()
		r := newRunners(time.Minute)
		for range 100 {
			done := make(chan struct{})
			r.Go(func() { close(done) })
			<-done
			// Give the goroutine the moment it needs to wait for the next run
			// again; one that misses it only costs a goroutine.
			time.Sleep(time.Millisecond)
		}
		// A goroutine for each run would be 100.
		if n := r.started.Load(); n > 20 {
			t.Errorf("100 runs one after another started %d goroutines", n)
		}
		r.stop()
		r.wait() // returns: the idle goroutine exits on stop
	})
	t.Run("concurrent", func(t *testing.T) {
		t.Parallel()
		r := newRunners(time.Minute)
		release := make(chan struct{})
		var ran atomic.Int64
		for range 8 {
			r.Go(func() { <-release; ran.Add(1) })
		}
		if n := r.started.Load(); n != 8 {
			t.Errorf("8 blocked runs started %d goroutines, want 8", n)
		}
		close(release)
		r.stop()
		r.wait()
		if ran.Load() != 8 {
			t.Errorf("%d of 8 runs ran", ran.Load())
		}
	})
	t.Run("idle exit", func(t *testing.T) {
		t.Parallel()
		r := newRunners(10 * time.Millisecond)
		r.Go(func() {})
		done := make(chan struct{})
		go func() { r.wait(); close(done) }() // without stop: only the idle timeout ends it
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("an idle goroutine did not exit after its idle time")
		}
		r.Go(func() {}) // a new goroutine serves the next run
		if n := r.started.Load(); n != 2 {
			t.Errorf("started %d goroutines, want 2", n)
		}
		r.stop()
		r.wait()
	})
}
