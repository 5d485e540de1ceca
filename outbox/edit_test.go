package outbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/delayq/delayq/outbox"
)

// A dead task retried with an edited payload becomes pending as a new version, due
// now, its attempts reset, the relay notified; only from the dead version edited.
func TestRetryDeadEdited(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	small := newClient(t, outbox.Config{MaxPayloadBytes: 16})
	for _, id := range []string{"a", "live"} {
		if _, err := b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "q", ID: id, Payload: []byte(`{"card":"old"}`), Delay: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := b.client.RecordFailure(ctx, b.pool, "q", "a", 1, 3, "declined", true); err != nil || !ok {
		t.Fatalf("kill: %v %v", ok, err)
	}
	l := listen(t, b.url)

	// Refused, and nothing changed: bad input, too large, the wrong version, not dead, no row.
	for _, c := range []struct {
		client  *outbox.Client
		id      string
		version int
		payload string
		want    error
	}{
		{b.client, "a", 0, `{}`, outbox.ErrInvalidConfig},
		{small, "a", 1, `{"card":"a-long-new-one"}`, outbox.ErrPayloadTooLarge},
		{b.client, "a", 2, `{}`, outbox.ErrStale},
		{b.client, "live", 1, `{}`, outbox.ErrStale},
		{b.client, "nope", 1, `{}`, outbox.ErrNotFound},
		{b.client, "bad id", 1, `{}`, outbox.ErrInvalidTaskID},
	} {
		if _, err := c.client.RetryDeadEdited(ctx, b.pool, "q", c.id, c.version, []byte(c.payload)); !errors.Is(err, c.want) {
			t.Errorf("%s v%d: %v, want %v", c.id, c.version, err, c.want)
		}
	}
	if s := load(t, b.pool, "q", "a"); s.state != "dead" || s.vers != 1 || string(s.payload) != `{"card":"old"}` {
		t.Fatalf("refused edits changed the row: %+v", s)
	}

	before := time.Now()
	v, err := b.client.RetryDeadEdited(ctx, b.pool, "q", "a", 1, []byte(`{"card":"new"}`))
	if err != nil || v != 2 {
		t.Fatalf("RetryDeadEdited: %d %v", v, err)
	}
	s := load(t, b.pool, "q", "a")
	if s.state != "pending" || s.vers != 2 || s.attempt != 0 || string(s.payload) != `{"card":"new"}` || s.doneAt != nil ||
		s.runAt.Before(before.Add(-time.Second)) || s.runAt.After(time.Now().Add(time.Second)) {
		t.Errorf("after the edit: %+v", s)
	}
	if got := nextNotification(t, l); got != "q" {
		t.Errorf("notification %q", got)
	}
	// The same edit again is stale: the row is version 2 and pending.
	if _, err := b.client.RetryDeadEdited(ctx, b.pool, "q", "a", 1, []byte(`{}`)); !errors.Is(err, outbox.ErrStale) {
		t.Errorf("second edit: %v", err)
	}
}
