package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/delayq/delayq/outbox"
)

// key is a task's identity.
type key struct{ queue, id string }

func (k key) String() string { return k.queue + "/" + k.id }

// load is the producer of a scenario: n tasks enqueued in business transactions
// of 1..8 tasks, spread over dur. A tenth of the transactions roll back; about
// 3% of the tasks fail at every run (two attempts, then dead); about 4% are
// delayed 3s and cancelled right after their commit. The rest are due at once or
// within 1.5s. It remembers what it knows of each transaction's fate.
type load struct {
	s   *system
	n   int
	dur time.Duration
	// runAt, when set, turns a delay into the task's RunAt (the clock scenario
	// reckons on the Redis clock); otherwise the task gets the Delay, on the
	// database clock.
	runAt func(d time.Duration) time.Time
	// deadline, when set, gives about half of the tasks that do not fail a start
	// deadline (outbox.Task.StartBy) 1 to deadline after their due time (local
	// clock: the machine's, as the Redis clock).
	deadline time.Duration

	mu         sync.Mutex
	committed  map[key]bool // commit returned nil
	ambiguous  map[key]bool // commit returned an error: the outbox tells
	rolledBack map[key]bool // never committed (rolled back, or failed before the commit)
	cancelled  map[key]bool // Cancel returned nil
	failing    map[key]bool // meant to end dead (whatever their transaction's fate)
	startBy    map[key]time.Time
	errs       int
	lastErr    error
}

func (s *system) newLoad(n int, dur time.Duration) *load {
	return &load{
		s: s, n: n, dur: dur,
		committed: map[key]bool{}, ambiguous: map[key]bool{}, rolledBack: map[key]bool{},
		cancelled: map[key]bool{}, failing: map[key]bool{}, startBy: map[key]time.Time{},
	}
}

// start runs the load in a goroutine; the channel closes when it is over. The
// test's end stops it.
func (l *load) start(ctx context.Context) <-chan struct{} {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(ctx)
	}()
	l.s.t.Cleanup(func() { cancel(); <-done })
	return done
}

func (l *load) run(ctx context.Context) {
	begin := time.Now()
	for seq := 0; seq < l.n && ctx.Err() == nil; {
		// The transaction starting with task seq is due at begin + dur·seq/n.
		if !pause(ctx, time.Until(begin.Add(l.dur*time.Duration(seq)/time.Duration(l.n)))) {
			return
		}
		size := min(1+rand.IntN(8), l.n-seq)
		tasks, toCancel := l.batch(seq, size)
		seq += size
		l.enqueue(ctx, tasks, toCancel, rand.IntN(10) == 0)
	}
}

// batch makes the tasks seq..seq+size-1 and says which to cancel.
func (l *load) batch(seq, size int) ([]outbox.Task, []key) {
	tasks := make([]outbox.Task, size)
	var toCancel []key
	for j := range tasks {
		t := outbox.Task{
			Queue:   l.s.queues[rand.IntN(len(l.s.queues))],
			ID:      fmt.Sprintf("t%05d", seq+j),
			Payload: []byte(payloadOK),
		}
		var delay time.Duration
		switch r := rand.IntN(100); {
		case r < 3:
			t.Payload, t.MaxAttempts = []byte(payloadFail), failAttempts
			delay = between(0, 500*time.Millisecond)
			l.mu.Lock()
			l.failing[key{t.Queue, t.ID}] = true
			l.mu.Unlock()
		case r < 7:
			delay = 3 * time.Second
			toCancel = append(toCancel, key{t.Queue, t.ID})
		case r < 53:
			delay = between(0, 1500*time.Millisecond)
		}
		if l.runAt != nil {
			t.RunAt = l.runAt(delay)
		} else {
			t.Delay = delay
		}
		if l.deadline > 0 && string(t.Payload) == payloadOK && rand.IntN(2) == 0 {
			t.StartBy = time.Now().Add(delay + between(time.Second, l.deadline))
			if !t.RunAt.IsZero() {
				t.StartBy = t.RunAt.Add(between(time.Second, l.deadline))
			}
			l.mu.Lock()
			l.startBy[key{t.Queue, t.ID}] = t.StartBy
			l.mu.Unlock()
		}
		tasks[j] = t
	}
	return tasks, toCancel
}

// enqueue runs one business transaction: the tasks, then a commit (or a
// rollback), then the cancellations.
func (l *load) enqueue(ctx context.Context, tasks []outbox.Task, toCancel []key, rollback bool) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	record := func(m map[key]bool) {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, t := range tasks {
			m[key{t.Queue, t.ID}] = true
		}
	}
	tx, err := l.s.admin.Begin(ctx)
	if err != nil {
		record(l.rolledBack)
		l.failed(ctx, err)
		return
	}
	res, err := l.s.ob.EnqueueMany(ctx, tx, tasks)
	if err == nil && res.Inserted != len(tasks) {
		l.s.t.Errorf("outbox: %d of %d new tasks inserted (duplicates %v)", res.Inserted, len(tasks), res.Duplicates)
	}
	if err != nil || rollback {
		_ = tx.Rollback(ctx)
		record(l.rolledBack)
		if err != nil {
			l.failed(ctx, err)
		}
		return
	}
	if err := tx.Commit(ctx); err != nil {
		record(l.ambiguous)
		l.failed(ctx, err)
		return
	}
	record(l.committed)
	for _, k := range toCancel {
		if err := l.s.ob.Cancel(ctx, l.s.admin, k.queue, k.id); err == nil {
			l.mu.Lock()
			l.cancelled[k] = true
			l.mu.Unlock()
		}
	}
}

// failed counts a producer error (a server down) and pauses a little.
func (l *load) failed(ctx context.Context, err error) {
	l.mu.Lock()
	l.errs++
	l.lastErr = err
	l.mu.Unlock()
	pause(ctx, 50*time.Millisecond)
}
