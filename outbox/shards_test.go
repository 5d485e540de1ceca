package outbox_test

import (
	"errors"
	"testing"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

func TestSetQueueShards(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	if validate.MaxShards != delayq.MaxShards {
		t.Fatalf("validate.MaxShards %d, delayq.MaxShards %d: they must agree", validate.MaxShards, delayq.MaxShards)
	}
	controls := func() map[string]outbox.QueueControl {
		t.Helper()
		ctls, err := b.client.QueueControls(ctx, b.pool)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]outbox.QueueControl{}
		for _, c := range ctls {
			m[c.Queue] = c
		}
		return m
	}

	// Empty: set, the same again (no bump), changed (bumped); a pause keeps it.
	c1, err := b.client.SetQueueShards(ctx, b.pool, "mail", 4)
	if err != nil || c1.Shards != 4 || c1.Version < 1 {
		t.Fatalf("4 shards: %+v, %v", c1, err)
	}
	if c, err := b.client.SetQueueShards(ctx, b.pool, "mail", 4); err != nil || c != c1 {
		t.Fatalf("4 shards again: %+v, %v; want %+v", c, err, c1)
	}
	c2, err := b.client.SetQueueShards(ctx, b.pool, "mail", 16)
	if err != nil || c2.Shards != 16 || c2.Version != c1.Version+1 {
		t.Fatalf("16 shards: %+v, %v", c2, err)
	}
	if p, err := b.client.PauseQueue(ctx, b.pool, "mail"); err != nil || p.Shards != 16 || !p.Paused || p.Version != c2.Version+1 {
		t.Fatalf("pause: %+v, %v", p, err)
	}
	c3 := controls()["mail"]

	// Bad input: typed, nothing written.
	for _, n := range []int{0, -3, 65} {
		if _, err := b.client.SetQueueShards(ctx, b.pool, "mail", n); !errors.Is(err, outbox.ErrInvalidShards) {
			t.Errorf("%d shards: %v, want ErrInvalidShards", n, err)
		}
	}
	if _, err := b.client.SetQueueShards(ctx, b.pool, "no queue", 2); !errors.Is(err, outbox.ErrInvalidQueue) {
		t.Errorf("bad queue: %v, want ErrInvalidQueue", err)
	}
	if c := controls()["mail"]; c != c3 {
		t.Errorf("refused input wrote: %+v, want %+v", c, c3)
	}

	// A pending, a queued, a dead task: refused, nothing written.
	if _, err := b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "mail", ID: "m-1"}); err != nil {
		t.Fatal(err)
	}
	for _, state := range []string{"pending", "queued", "dead"} {
		if _, err := b.pool.Exec(ctx, `UPDATE delayq_outbox SET state = $1,
			done_at = CASE WHEN $1 = 'dead' THEN now() END WHERE queue = 'mail' AND task_id = 'm-1'`, state); err != nil {
			t.Fatal(err)
		}
		if _, err := b.client.SetQueueShards(ctx, b.pool, "mail", 2); !errors.Is(err, outbox.ErrQueueNotEmpty) {
			t.Errorf("a %s task: %v, want ErrQueueNotEmpty", state, err)
		}
		if c := controls()["mail"]; c != c3 {
			t.Errorf("a %s task: the refusal wrote: %+v, want %+v", state, c, c3)
		}
		if c, err := b.client.SetQueueShards(ctx, b.pool, "mail", 16); err != nil || c != c3 {
			t.Errorf("a %s task, the same count: %+v, %v; want %+v", state, c, err, c3)
		}
	}
	// Done: the queue is empty again.
	if _, err := b.pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'done', done_at = now() WHERE queue = 'mail'`); err != nil {
		t.Fatal(err)
	}
	if c, err := b.client.SetQueueShards(ctx, b.pool, "mail", 1); err != nil || c.Shards != 1 || c.Version != c3.Version+1 || !c.Paused {
		t.Errorf("after the task is done, 1 shard: %+v, %v", c, err)
	}
}
