package outbox

import (
	"fmt"
	"testing"
	"time"
)

// TestNotifiersRenewal walks one queue's notifiers through a cooldown: the first
// notifier is leaned on, one enqueue half-way through renews it, the renewal
// takes over when the first expires, and nothing is leaned on once all expired.
func TestNotifiersRenewal(t *testing.T) {
	t.Parallel()
	const cd = 100 * time.Millisecond
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	n := newNotifiers(cd)
	check := func(ms int, wantID any, wantRenew bool) {
		t.Helper()
		id, _, renew := n.lookup("q", at(ms))
		if id != wantID || renew != wantRenew {
			t.Fatalf("at %dms: lookup = %v, renew %v; want %v, %v", ms, id, renew, wantID, wantRenew)
		}
	}
	check(0, nil, false)
	n.done("q", notifier{id: "a", sent: at(0)}, false, true)
	check(10, "a", false)
	check(50, nil, true) // the renewal: it notifies
	check(51, "a", false)
	n.done("q", notifier{id: "x", sent: at(52)}, false, true) // notified too (a in progress): a stays
	check(60, "a", false)
	n.done("q", notifier{id: "b", sent: at(50)}, true, true)
	check(99, "a", false)
	check(100, nil, true)                                      // a expired, b took over half-way through its own cooldown
	n.done("q", notifier{id: "c", sent: at(100)}, true, false) // a renewal that did not notify (a duplicate)
	check(101, nil, true)
	n.done("q", notifier{id: "d", sent: at(101)}, true, true)
	check(149, "b", false)
	check(150, "d", false)
	check(301, nil, false) // all expired
	n.done("q", notifier{id: "e", sent: at(301)}, false, true)
	check(302, "e", false)

	if off := newNotifiers(-1); off != nil {
		t.Fatalf("NotifyCooldown -1: %v", off)
	}
	var off *notifiers
	if id, _, renew := off.lookup("q", t0); id != nil || renew {
		t.Fatal("a nil notifiers leaned on something")
	}
	off.done("q", notifier{}, false, true)
}

// TestNotifiersBounded: at most maxNotifiers queues are remembered; a queue past
// it notifies until a remembered one expires.
func TestNotifiersBounded(t *testing.T) {
	t.Parallel()
	n := newNotifiers(time.Second)
	t0 := time.Unix(1000, 0)
	for i := range maxNotifiers + 1 {
		n.done(fmt.Sprint("q", i), notifier{id: "a", sent: t0}, false, true)
	}
	if len(n.byQueue) != maxNotifiers {
		t.Fatalf("%d queues remembered, want %d", len(n.byQueue), maxNotifiers)
	}
	last := fmt.Sprint("q", maxNotifiers)
	if id, _, _ := n.lookup(last, t0); id != nil {
		t.Fatalf("the queue past the bound leans on %v", id)
	}
	later := t0.Add(time.Second)
	n.done(last, notifier{id: "b", sent: later}, false, true)
	if id, _, _ := n.lookup(last, later); id != "b" || len(n.byQueue) != 1 {
		t.Fatalf("after the others expired: lookup %v, %d queues", id, len(n.byQueue))
	}
}
