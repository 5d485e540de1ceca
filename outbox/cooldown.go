package outbox

import (
	"sync"
	"time"
)

// maxNotifiers bounds the queues a Client remembers notifiers for; beyond it,
// enqueues into further queues notify at every commit until the remembered ones
// expire.
const maxNotifiers = 1024

// notifier is an enqueue that notified: its row's task_id and created_at, which
// the next enqueues' statements look for, and when it was sent.
type notifier struct {
	id        string
	createdAt time.Time
	sent      time.Time
}

// queueNotifiers is one queue's: cur is the notifier the enqueues lean on until
// its cooldown is over; next, sent once cur is half through its cooldown by one
// enqueue (renewing, meanwhile) that notifies on purpose, takes over then. So a
// committed notifier is at hand all along, and a queue with steady enqueues
// notifies about twice a cooldown, instead of every enqueue sent while a new
// notifier has yet to commit notifying too.
type queueNotifiers struct {
	cur, next *notifier
	renewing  bool
}

// notifiers remembers, per queue, the enqueues whose notifications the next ones
// lean on (Config.NotifyCooldown).
type notifiers struct {
	cooldown time.Duration
	mu       sync.Mutex
	byQueue  map[string]*queueNotifiers
}

func newNotifiers(cooldown time.Duration) *notifiers {
	if cooldown < 0 {
		return nil
	}
	return &notifiers{cooldown: cooldown, byQueue: make(map[string]*queueNotifiers)}
}

// live drops q's notifiers whose cooldown is over at now, next taking cur's place.
func (n *notifiers) live(q *queueNotifiers, now time.Time) {
	if q.cur != nil && now.Sub(q.cur.sent) >= n.cooldown {
		q.cur, q.next = q.next, nil
	}
	if q.cur != nil && now.Sub(q.cur.sent) >= n.cooldown {
		q.cur = nil
	}
}

// lookup returns the statement's arguments for an enqueue into queue at now: the
// task_id and created_at of the notifier to lean on, or two NULLs. renew is true
// for the enqueue chosen to notify as the next notifier; it must call done.
func (n *notifiers) lookup(queue string, now time.Time) (id, createdAt any, renew bool) {
	if n == nil {
		return nil, nil, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	q := n.byQueue[queue]
	if q == nil {
		return nil, nil, false
	}
	n.live(q, now)
	if q.cur == nil {
		return nil, nil, false
	}
	if q.next == nil && !q.renewing && now.Sub(q.cur.sent) >= n.cooldown/2 {
		q.renewing = true
		return nil, nil, true
	}
	return q.cur.id, q.cur.createdAt, false
}

// done records an enqueue into queue: e, if it notified, becomes the queue's
// notifier when it has none, or the next one when it is the renewal. A full map
// makes room by dropping the queues without a live notifier; when none is, e is
// not kept (the next enqueue notifies).
func (n *notifiers) done(queue string, e notifier, renew, notified bool) {
	if n == nil || !renew && !notified {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	q := n.byQueue[queue]
	if q == nil {
		if len(n.byQueue) >= maxNotifiers {
			for name, old := range n.byQueue {
				if n.live(old, e.sent); old.cur == nil && !old.renewing {
					delete(n.byQueue, name)
				}
			}
			if len(n.byQueue) >= maxNotifiers {
				return
			}
		}
		q = &queueNotifiers{}
		n.byQueue[queue] = q
	}
	if renew {
		q.renewing = false
		if notified {
			q.next = &e
		}
		return
	}
	if n.live(q, e.sent); q.cur == nil {
		q.cur = &e
	}
}
