package dispatch

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Waiter puts claimers to sleep until the next task of their queue falls due, or
// until a task is enqueued (or retried, released, reaped, requeued) ahead of the
// earliest one, whichever comes first. The scripts PUBLISH on the queue's wake
// channel only when the earliest due time of the queue moves earlier, so messages
// are rare. One Waiter holds one pub/sub connection for all its queues; share it
// among the claimers of a process.
//
// Use it in this order, so that an enqueue landing between the claim and the wait
// still wakes the claimer:
//
//	m, err := w.Mark(ctx, queue)      // before the claim
//	cl, err := c.Claim(ctx, queue, n, lease)
//	if len(cl.Tasks) == 0 {
//		err = w.Wait(ctx, m, cl.NextDue)
//	}
//
// Durations come from the Redis clock (Claim.NextDue), so skew between the
// machines' clocks does not matter. Wake-ups lost while the pub/sub connection is
// down are covered by Config.MaxWait, the longest single wait; after a reconnect
// every waiter of the Waiter wakes once.
type Waiter struct {
	c       *Client
	maxWait time.Duration

	mu     sync.Mutex
	ps     *redis.PubSub
	queues map[string]*wakeState // by wake channel
	closed bool
	done   chan struct{} // closed by Close
	loop   chan struct{} // closed when the receive loop ends
}

type wakeState struct {
	gen        uint64
	ch         chan struct{} // closed and replaced at each wake-up
	subscribed chan struct{} // closed at the first subscribe confirmation
	confirmed  bool
}

// Mark is a point in a queue's wake-up history, taken by Waiter.Mark before a claim.
type Mark struct {
	st  *wakeState
	gen uint64
}

// NewWaiter returns a Waiter on the client's Redis. It connects on the first Mark.
// Close it to release the connection.
func (c *Client) NewWaiter() *Waiter {
	return &Waiter{
		c:       c,
		maxWait: c.cfg.MaxWait,
		queues:  make(map[string]*wakeState),
		done:    make(chan struct{}),
		loop:    make(chan struct{}),
	}
}

// Mark subscribes to queue's wake-ups (once per queue; it waits until Redis has
// confirmed the subscription) and returns the current point, to pass to Wait after
// the claim. When Redis cannot take the subscription, the first Mark of the
// queue returns the error, and the next waits for go-redis's reconnect.
func (w *Waiter) Mark(ctx context.Context, queue string) (Mark, error) {
	k, err := w.c.Keys(queue)
	if err != nil {
		return Mark{}, err
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return Mark{}, ErrClosed
	}
	st, ok := w.queues[k.Wake]
	if !ok {
		st = &wakeState{ch: make(chan struct{}), subscribed: make(chan struct{})}
		w.queues[k.Wake] = st
		if w.ps == nil {
			w.ps = w.c.rdb.Subscribe(context.WithoutCancel(ctx))
			msgs := w.ps.ChannelWithSubscriptions(redis.WithChannelSize(64))
			go w.receive(msgs)
		}
	}
	ps := w.ps
	w.mu.Unlock()

	if !ok {
		// Outside the lock: it may dial. The channel is recorded even when the
		// write fails; go-redis then subscribes at its reconnect, and the
		// confirmation ends the wait of the next Mark. This one says Redis is
		// unreachable, so that the caller can say so (once: downlog) rather
		// than wait in silence.
		if err := ps.Subscribe(ctx, k.Wake); err != nil {
			w.c.cfg.Logger.Debug("delayq: subscribe failed, retried at reconnect", "channel", k.Wake, "err", err)
			return Mark{}, fmt.Errorf("delayq: subscribe to %s: %w", k.Wake, err)
		}
	}
	select {
	case <-st.subscribed:
	case <-ctx.Done():
		return Mark{}, ctx.Err()
	case <-w.done:
		return Mark{}, ErrClosed
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return Mark{st: st, gen: st.gen}, nil
}

// Wait sleeps for d (Claim.NextDue), at most Config.MaxWait, or until a wake-up for
// the queue of m arrives after m was taken; at once when one already has. d < 0 (an
// empty queue) waits Config.MaxWait, d = 0 returns at once. It returns nil after the
// sleep or a wake-up, ctx.Err() when ctx ends, ErrClosed when the Waiter is closed.
func (w *Waiter) Wait(ctx context.Context, m Mark, d time.Duration) error {
	if m.st == nil {
		return ErrInvalidArgument
	}
	if d == 0 {
		return ctx.Err()
	}
	if d < 0 || d > w.maxWait {
		d = w.maxWait
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrClosed
	}
	if m.st.gen != m.gen {
		w.mu.Unlock()
		return nil
	}
	wake := m.st.ch
	w.mu.Unlock()

	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-w.done:
		return ErrClosed
	}
}

// Woken returns a channel that is closed once a wake-up for the queue of m arrives
// after m was taken (already closed when one has): for a claimer that sleeps on
// several queues at once in one select. Unlike Wait it neither caps the sleep at
// Config.MaxWait nor watches the Waiter's Close: the caller does both.
func (w *Waiter) Woken(m Mark) <-chan struct{} {
	if m.st == nil {
		return closedChan()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if m.st.gen != m.gen {
		return closedChan()
	}
	return m.st.ch
}

// MaxWait is the longest single wait (Config.MaxWait): the backstop against lost
// wake-ups, for callers of Woken.
func (w *Waiter) MaxWait() time.Duration { return w.maxWait }

func closedChan() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// Close ends the pub/sub connection. Waits in progress return ErrClosed.
func (w *Waiter) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	close(w.done)
	ps := w.ps
	w.mu.Unlock()
	if ps == nil {
		return nil
	}
	err := ps.Close()
	<-w.loop
	return err
}

func (w *Waiter) receive(msgs <-chan any) {
	defer close(w.loop)
	for m := range msgs {
		switch m := m.(type) {
		case *redis.Message:
			w.wake(m.Channel, false)
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				w.wake(m.Channel, true)
			}
		}
	}
}

// wake bumps the state of channel. A subscribe confirmation for a channel already
// confirmed means go-redis reconnected and subscribed again: wake-ups may have been
// lost in between, so the waiters wake and claim once.
func (w *Waiter) wake(channel string, subscribe bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	st, ok := w.queues[channel]
	if !ok {
		return
	}
	if subscribe && !st.confirmed {
		st.confirmed = true
		close(st.subscribed)
		return
	}
	if subscribe {
		w.c.cfg.Logger.Info("delayq: wake-up channel subscribed again after a reconnect", "channel", channel)
	}
	st.gen++
	close(st.ch)
	st.ch = make(chan struct{})
}
