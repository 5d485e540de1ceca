package outbox

import (
	"sync"
	"time"
)

// maxNotifiers bounds the queues a Client remembers a notifier for; beyond it,
// enqueues into further queues notify at every commit until the remembered ones
// expire.
const maxNotifiers = 1024

// notifier is an enqueue that notified: its row's task_id and created_at, which
// the next enqueue's statement looks for, and when it was sent.
type notifier struct {
	id        string
	createdAt time.Time
	sent      time.Time
}

// notifiers remembers, per queue, the enqueue whose notification the next ones of
// the cooldown lean on (Config.NotifyCooldown). It is kept until the cooldown
// since it was sent has passed, even when later enqueues notify too (it was in
// progress, or rolled back, when they ran): it is the one most likely to have
// committed by the time the next enqueue asks.
type notifiers struct {
	cooldown time.Duration
	mu       sync.Mutex
	byQueue  map[string]notifier
}

func newNotifiers(cooldown time.Duration) *notifiers {
	if cooldown < 0 {
		return nil
	}
	return &notifiers{cooldown: cooldown, byQueue: make(map[string]notifier)}
}

// lookup returns the statement's arguments for queue at now: the notifier's
// task_id and created_at, or two NULLs when there is none within the cooldown.
func (n *notifiers) lookup(queue string, now time.Time) (id, createdAt any) {
	if n == nil {
		return nil, nil
	}
	n.mu.Lock()
	e, ok := n.byQueue[queue]
	n.mu.Unlock()
	if !ok || now.Sub(e.sent) >= n.cooldown {
		return nil, nil
	}
	return e.id, e.createdAt
}

// notified records e, an enqueue into queue that notified, unless the queue's
// notifier is still within its cooldown. A full map makes room by dropping the
// expired; when none is, e is not kept (the next enqueue notifies).
func (n *notifiers) notified(queue string, e notifier) {
	if n == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if old, ok := n.byQueue[queue]; ok && e.sent.Sub(old.sent) < n.cooldown {
		return
	} else if !ok && len(n.byQueue) >= maxNotifiers {
		for q, old := range n.byQueue {
			if e.sent.Sub(old.sent) >= n.cooldown {
				delete(n.byQueue, q)
			}
		}
		if len(n.byQueue) >= maxNotifiers {
			return
		}
	}
	n.byQueue[queue] = e
}
