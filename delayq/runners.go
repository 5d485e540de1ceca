package delayq

import (
	"sync"
	"sync/atomic"
	"time"
)

// runnerIdle is how long a run's goroutine waits for the next run before it exits.
const runnerIdle = 30 * time.Second

// runners starts runs on goroutines that it keeps after their run, for the next
// one. A run's stack grows to what pgx and the handler need; a new goroutine for
// each run grew it again each time, which took 12 % of the worker's CPU in
// drain-tx (BENCHMARKS.md). A goroutine that finds no run within idle exits, so a
// burst does not leave its goroutines behind for good.
type runners struct {
	wg   sync.WaitGroup
	next chan func() // unbuffered: a send succeeds only to an idle goroutine
	quit chan struct{}
	idle time.Duration

	started atomic.Int64 // goroutines started, for tests
}

func newRunners(idle time.Duration) *runners {
	return &runners{next: make(chan func()), quit: make(chan struct{}), idle: idle}
}

// Go runs f on an idle goroutine, or on a new one when none is idle.
func (r *runners) Go(f func()) {
	select {
	case r.next <- f:
	default:
		r.started.Add(1)
		r.wg.Go(func() {
			f()
			r.serve()
		})
	}
}

// serve runs what Go hands over until idle passes without any, or until stop.
func (r *runners) serve() {
	t := time.NewTimer(r.idle)
	defer t.Stop()
	for {
		select {
		case f := <-r.next:
			f()
			t.Reset(r.idle)
		case <-t.C:
			return
		case <-r.quit:
			return
		}
	}
}

// stop lets idle goroutines exit; call it once, after the last Go.
func (r *runners) stop() { close(r.quit) }

// wait returns when every run has returned and every goroutine has exited.
func (r *runners) wait() { r.wg.Wait() }
