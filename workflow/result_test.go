package workflow_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtest"
	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/workflow"
)

// A result commits with its run's completion, or not at all, and the
// dependent reads its dependencies' results in its own run.
func TestResults(t *testing.T) {
	t.Parallel()
	e := delayqtest.New(t, delayqtest.Options{})
	c := e.Client(t, delayq.Config{})
	wf := workflow.New(c)
	ctx := context.Background()
	if err := c.HandleTx("p", func(ctx context.Context, tx pgx.Tx, task *delayq.Task) error {
		if err := wf.SetResult(ctx, tx, task, []byte(task.ID+"-ok")); err != nil {
			return err
		}
		if strings.HasPrefix(task.ID, "fail-") {
			return errors.New("planned failure")
		}
		return nil
	}, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := c.HandleTx("d", func(ctx context.Context, tx pgx.Tx, task *delayq.Task) error {
		var parts [][]byte
		for _, id := range strings.Split(string(task.Payload), ",") {
			r, st, err := wf.Result(ctx, tx, "p", id)
			if err != nil {
				return err
			}
			if st != delayqtype.StateDone {
				return errors.New(id + " is " + string(st))
			}
			parts = append(parts, r)
		}
		return wf.SetResult(ctx, tx, task, bytes.Join(parts, []byte("+")))
	}, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		for _, id := range []string{"a", "b", "fail-c"} {
			if _, err := c.Outbox().Enqueue(ctx, tx, outbox.Task{Queue: "p", ID: id}); err != nil {
				return err
			}
		}
		_, err := wf.Enqueue(ctx, tx, outbox.Task{Queue: "d", ID: "join", Payload: []byte("a,b")}, workflow.On("p", "a"), workflow.On("p", "b"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if res := e.Work(ctx, t, c, "p", id); res.Outcome != delayq.OutcomeSucceeded {
			t.Fatalf("%s: %v %v", id, res.Outcome, res.Err)
		}
	}
	if res := e.Work(ctx, t, c, "p", "fail-c"); res.Outcome != delayq.OutcomeRetried {
		t.Fatalf("fail-c: %v", res.Outcome)
	}
	if r, st, err := wf.Result(ctx, e.Pool, "p", "fail-c"); err != nil || r != nil || st.Finished() {
		t.Errorf("a failed run's result: %q %s %v, want none (rolled back)", r, st, err)
	}
	if res := e.Work(ctx, t, c, "d", "join"); res.Outcome != delayq.OutcomeSucceeded {
		t.Fatalf("join: %v %v", res.Outcome, res.Err)
	}
	if r, st, err := wf.Result(ctx, e.Pool, "d", "join"); err != nil || string(r) != "a-ok+b-ok" || st != delayqtype.StateDone {
		t.Errorf("join's result: %q %s %v", r, st, err)
	}
	if _, _, err := wf.Result(ctx, e.Pool, "d", "nope"); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("no row: %v", err)
	}
	if err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		task := &delayq.Task{Queue: "p", ID: "fail-c", Version: 1}
		if err := wf.SetResult(ctx, tx, task, make([]byte, workflow.MaxResultBytes+1)); !errors.Is(err, workflow.ErrResultTooLarge) {
			t.Errorf("too large: %v", err)
		}
		task.Version = 2
		if err := wf.SetResult(ctx, tx, task, []byte("x")); !errors.Is(err, outbox.ErrStale) {
			t.Errorf("another version: %v", err)
		}
		task = &delayq.Task{Queue: "p", ID: "a", Version: 1}
		if err := wf.SetResult(ctx, tx, task, []byte("x")); !errors.Is(err, outbox.ErrStale) {
			t.Errorf("a finished task: %v", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
