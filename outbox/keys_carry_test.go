package outbox_test

import (
	"testing"
	"time"

	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/workflow"
)

// Every insert carries the task's concurrency key: a debounced or replacing
// enqueue's insert, a batch's callback and children.
func TestConcurrencyKeyOnEveryInsert(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	if _, err := b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "q", ID: "deb", Debounce: time.Minute, ConcurrencyKey: "tenant-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "q", ID: "rep", Replace: true, ConcurrencyKey: "tenant-2"}); err != nil {
		t.Fatal(err)
	}
	wf := workflow.New(b.client)
	kids := []outbox.Task{{Queue: "q", ID: "k1", ConcurrencyKey: "tenant-3"}, {Queue: "q", ID: "k2"}, {Queue: "q", ID: "k3", ConcurrencyKey: "tenant-4"}}
	if _, err := wf.Batch(ctx, b.pool, outbox.Task{Queue: "cb", ID: "done", ConcurrencyKey: "tenant-5"}, kids); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"deb": "tenant-1", "rep": "tenant-2", "k1": "tenant-3", "k2": "", "k3": "tenant-4", "done": "tenant-5"} {
		var got string
		if err := b.pool.QueryRow(ctx, `SELECT COALESCE(concurrency_key, '') FROM delayq_outbox WHERE task_id = $1`, id).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s: concurrency key %q, want %q", id, got, want)
		}
	}
}
