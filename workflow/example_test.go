package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/workflow"
)

// Ship an order once its stock is reserved and its card charged: the three
// tasks are enqueued in the transaction that places the order, and the
// completion of the last of reserve and charge releases ship in its own
// transaction.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	ob, err := outbox.New(outbox.Config{}) // or a *delayq.Client
	if err != nil {
		log.Fatal(err)
	}
	wf := workflow.New(ob)

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, q := range []string{"reserve", "charge"} {
			if _, err := ob.Enqueue(ctx, tx, outbox.Task{Queue: q, ID: "order-1001"}); err != nil {
				return err
			}
		}
		res, err := wf.Enqueue(ctx, tx, outbox.Task{Queue: "ship", ID: "order-1001"},
			workflow.On("reserve", "order-1001"), workflow.On("charge", "order-1001"))
		if err != nil {
			return err
		}
		fmt.Println(res.State) // waiting
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A dependency's policy says what its death does to the waiting task: here a
// notification is sent whether the export succeeded or not.
func ExampleClient_Enqueue() {
	ctx := context.Background()
	var (
		tx pgx.Tx           // the caller's transaction
		wf *workflow.Client // workflow.New(client)
	)
	_, err := wf.Enqueue(ctx, tx, outbox.Task{Queue: "notify", ID: "export-7"},
		workflow.Dependency{Queue: "export", ID: "export-7", OnFailure: workflow.Run})
	switch {
	case errors.Is(err, workflow.ErrUnknownDependency):
		// export-7 was never enqueued (or its row was pruned): nothing written
	case err != nil:
		log.Fatal(err)
	}
}

// Three steps one after the other; if one dies, the rest of the chain is
// cancelled with the reason.
func ExampleClient_Chain() {
	ctx := context.Background()
	var (
		tx pgx.Tx
		wf *workflow.Client
	)
	_, err := wf.Chain(ctx, tx, workflow.Skip,
		outbox.Task{Queue: "extract", ID: "day-2026-12-05"},
		outbox.Task{Queue: "transform", ID: "day-2026-12-05"},
		outbox.Task{Queue: "load", ID: "day-2026-12-05"})
	if err != nil {
		log.Fatal(err)
	}
}

// A handler stores a small result with its completion; the task that waits on
// it reads it in its own run.
func ExampleClient_SetResult() {
	var (
		client *delayq.Client // the application's
		wf     = workflow.New(client)
	)
	_ = client.HandleTx("charge", func(ctx context.Context, tx pgx.Tx, t *delayq.Task) error {
		// ... charge the card in tx ...
		return wf.SetResult(ctx, tx, t, []byte("ch_3PZ1")) // commits with the completion, or not at all
	}, delayq.QueueConfig{})
	_ = client.HandleTx("ship", func(ctx context.Context, tx pgx.Tx, t *delayq.Task) error {
		charge, _, err := wf.Result(ctx, tx, "charge", t.ID)
		if err != nil {
			return err
		}
		fmt.Printf("shipping %s, paid by %s\n", t.ID, charge)
		return nil
	}, delayq.QueueConfig{})
}

// A batch of thumbnails with one callback that runs when all are finished,
// exactly once, and reads how they ended in its own transaction.
func ExampleClient_Batch() {
	var (
		client *delayq.Client // the application's
		wf     = workflow.New(client)
		ctx    = context.Background()
		tx     pgx.Tx // the caller's transaction
	)
	images := []outbox.Task{{Queue: "thumb", ID: "img-1"}, {Queue: "thumb", ID: "img-2"}}
	res, err := wf.Batch(ctx, tx, outbox.Task{Queue: "album-ready", ID: "album-7"}, images)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Children, "children") // 2 children, unless some existed
	_ = client.HandleTx("album-ready", func(ctx context.Context, tx pgx.Tx, t *delayq.Task) error {
		counts, err := wf.BatchCounts(ctx, tx, t.Queue, t.ID)
		if err != nil {
			return err
		}
		fmt.Printf("%d of %d thumbnails made, %d failed\n", counts.Done, counts.Total, counts.Dead+counts.Cancelled)
		return nil
	}, delayq.QueueConfig{})
	// Later, to give up on what has not run yet:
	_, _ = wf.Cancel(ctx, tx, "album-ready", "album-7")
}
