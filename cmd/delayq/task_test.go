package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/workflow"
)

// delayq task show prints a task's row and its attempt history: the failed runs
// with their errors, a panic's stack, and a done task's success; --json the same
// as JSON. An unknown task is a failure, a missing flag a usage error.
func TestTaskShowCommand(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	b.exec(t, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, attempt, last_error, done_at, attempt_log)
VALUES ('pay', 'o-1', now(), 'p', 5, 'done', 2, 'panic: nil map', now(), '[
  {"attempt": 1, "version": 1, "at": "2026-12-04T22:00:00.5+00:00", "outcome": "retried", "error": "card declined"},
  {"attempt": 2, "version": 1, "at": "2026-12-04T22:00:01+00:00", "outcome": "retried", "error": "panic: nil map",
   "stack": "goroutine 7 [running]:\nshop.charge()\n\t/src/shop/charge.go:42"}]'),
  ('pay', 'fresh', now(), 'p', 5, 'pending', 0, NULL, NULL, NULL)`)

	r := b.run(t, "task", "show", "--queue", "pay", "--id", "o-1")
	r.want(t, exitOK, "pay/o-1", "done", "2 of 5", "VERSION", "OUTCOME",
		"retried", "card declined", "panic: nil map", "succeeded",
		"stack of version 1, attempt 2:\n  goroutine 7 [running]:\n  shop.charge()\n  \t/src/shop/charge.go:42\n")
	if i, j := strings.Index(r.stdout, "card declined"), strings.Index(r.stdout, "succeeded"); i < 0 || j < i {
		t.Errorf("runs out of order:\n%s", r.stdout)
	}

	r = b.run(t, "task", "show", "--queue", "pay", "--id", "o-1", "--json")
	r.want(t, exitOK)
	var v taskView
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("--json: %v\n%s", err, r.stdout)
	}
	if v.State != "done" || len(v.Attempts) != 3 || v.Attempts[0].Error != "card declined" ||
		!strings.Contains(v.Attempts[1].Stack, "charge.go:42") || v.Attempts[2].Outcome != "succeeded" || v.Attempts[2].Attempt != 3 {
		t.Errorf("--json: %+v", v)
	}

	b.run(t, "task", "show", "--queue", "pay", "--id", "fresh").want(t, exitOK, "pending", "no run recorded")
	r = b.run(t, "task", "show", "--queue", "pay", "--id", "nope")
	r.want(t, exitFailure)
	r.oneLineErr(t, "not found")
	b.run(t, "task", "show", "--queue", "pay").want(t, exitUsage)
	b.run(t, "task", "list").want(t, exitUsage)
	b.run(t, "task", "--help").want(t, exitOK, "attempt history")
}

// delayq task show of a workflow's tasks: a waiting task's unfinished
// dependencies with their states and policies, a task's dependents (the count
// and the first 10; --json 100), a stored result as text or base64.
func TestTaskShowWorkflow(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	ctx := context.Background()
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	wf := workflow.New(ob)
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := ob.EnqueueMany(ctx, tx, []outbox.Task{{Queue: "pay", ID: "a"}, {Queue: "pay", ID: "b"}}); err != nil {
			return err
		}
		if _, err := wf.Enqueue(ctx, tx, outbox.Task{Queue: "ship", ID: "j"}, workflow.On("pay", "a"),
			workflow.Dependency{Queue: "pay", ID: "b", OnFailure: workflow.Skip}); err != nil {
			return err
		}
		for i := range 11 {
			if _, err := wf.Enqueue(ctx, tx, outbox.Task{Queue: "ship", ID: fmt.Sprintf("k%02d", i)}, workflow.On("pay", "a")); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b.exec(t, `UPDATE delayq_outbox SET state = 'done', done_at = now(), result = 'receipt 42' WHERE queue = 'pay' AND task_id = 'b'`)

	r := b.run(t, "task", "show", "--queue", "ship", "--id", "j")
	r.want(t, exitOK, "waiting", "waits for", "1 unfinished dependencies", "DEPENDENCY (unfinished)", "pay/a", "pending", "fail")
	if strings.Contains(r.stdout, "pay/b") || strings.Contains(r.stdout, "DEPENDENT\t") {
		t.Errorf("a settled dependency, or dependents, listed:\n%s", r.stdout)
	}
	r = b.run(t, "task", "show", "--queue", "pay", "--id", "a")
	r.want(t, exitOK, "12 dependents waiting on it, the first 10:", "ship/j", "ship/k08")
	if strings.Contains(r.stdout, "ship/k09") {
		t.Errorf("more than 10 dependents printed:\n%s", r.stdout)
	}
	r = b.run(t, "task", "show", "--queue", "pay", "--id", "a", "--json")
	var v taskView
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("--json: %v\n%s", err, r.stdout)
	}
	if v.DependentsCount != 12 || len(v.Dependents) != 12 || v.Dependents[0] != (linkView{Queue: "ship", ID: "j", State: "waiting", Policy: "fail"}) || v.Result != nil {
		t.Errorf("--json of a: %+v", v)
	}
	r = b.run(t, "task", "show", "--queue", "ship", "--id", "j", "--json")
	v = taskView{}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("--json: %v\n%s", err, r.stdout)
	}
	if v.WaitsFor != 1 || len(v.Dependencies) != 1 || v.Dependencies[0] != (linkView{Queue: "pay", ID: "a", State: "pending", Policy: "fail"}) {
		t.Errorf("--json of j: %+v", v)
	}
	b.run(t, "task", "show", "--queue", "pay", "--id", "b").want(t, exitOK, `result`, `10 bytes: "receipt 42"`)
	b.exec(t, `UPDATE delayq_outbox SET result = '\xff00'::bytea WHERE queue = 'pay' AND task_id = 'b'`)
	b.run(t, "task", "show", "--queue", "pay", "--id", "b").want(t, exitOK, "2 bytes: base64 /wA=")
	r = b.run(t, "task", "show", "--queue", "pay", "--id", "b", "--json")
	v = taskView{}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Result == nil || v.Result.Base64 != "/wA=" || v.Result.Bytes != 2 {
		t.Errorf("--json of b: %+v, %v", v.Result, err)
	}
}

// delayq task show of a batch's callback: the batch's progress, children
// finished of all and how they ended; --json the counts.
func TestTaskShowBatch(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	ctx := context.Background()
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	wf := workflow.New(ob)
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := wf.Batch(ctx, tx, outbox.Task{Queue: "album", ID: "a1"},
			[]outbox.Task{{Queue: "img", ID: "1"}, {Queue: "img", ID: "2"}, {Queue: "img", ID: "3"}, {Queue: "img", ID: "4"}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	b.exec(t, `UPDATE delayq_outbox SET state = 'done', done_at = now() WHERE queue = 'img' AND task_id = '1'`)
	b.exec(t, `UPDATE delayq_outbox SET state = 'dead', done_at = now() WHERE queue = 'img' AND task_id = '2'`)
	b.run(t, "task", "show", "--queue", "album", "--id", "a1").want(t, exitOK, "waiting",
		"2 of 4 children finished: 1 done, 1 dead, 0 cancelled")
	r := b.run(t, "task", "show", "--queue", "album", "--id", "a1", "--json")
	var v taskView
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("--json: %v\n%s", err, r.stdout)
	}
	if v.Batch == nil || *v.Batch != (batchView{Total: 4, Remaining: 2, Done: 1, Dead: 1}) {
		t.Errorf("--json: %+v", v.Batch)
	}
	if r := b.run(t, "task", "show", "--queue", "img", "--id", "3"); strings.Contains(r.stdout, "children finished") {
		t.Errorf("a child shown as a batch:\n%s", r.stdout)
	}
}
