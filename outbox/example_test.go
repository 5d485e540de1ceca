package outbox_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"encoding/json"
	"github.com/delayq/delayq/outbox"
)

// Enqueue a delayed task in the same transaction as the business change that needs it.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	client, err := outbox.New(outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'awaiting_payment' WHERE id = $1`, 1001); err != nil {
			return err
		}
		payload, err := json.Marshal(map[string]any{"order": 1001})
		if err != nil {
			return err
		}
		res, err := client.Enqueue(ctx, tx, outbox.Task{
			Queue:   "payment",
			ID:      "order-1001",
			Payload: payload,
			Delay:   30 * time.Minute,
		})
		if err != nil {
			return err
		}
		if res.Duplicate {
			fmt.Println("already scheduled")
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Charge is the payload of the "charge" queue.
type Charge struct {
	Order       string `json:"order"`
	AmountCents int    `json:"amount_cents"`
}

// Charges is declared once and used by producers and workers alike.
var Charges = outbox.Queue[Charge]{Name: "charge"}

// A typed queue builds the task from a value: the payload is JSON unless the
// queue names another Codec.
func ExampleQueue_Task() {
	t, err := Charges.Task(outbox.Task{ID: "order-1001", Delay: 30 * time.Minute}, Charge{Order: "order-1001", AmountCents: 1250})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(t.Queue, t.ID, string(t.Payload))
	v, err := Charges.Decode(t.Payload)
	fmt.Println(v.AmountCents, err)
	// Output:
	// charge order-1001 {"order":"order-1001","amount_cents":1250}
	// 1250 <nil>
}

// Payloads decode strictly: a field the type does not have (a misspelling, or
// another type's payload) is an invalid payload, which a worker makes dead at
// once, with this reason.
func ExampleJSONCodec() {
	_, err := Charges.Decode([]byte(`{"order":"order-1001","amount":1250}`))
	fmt.Println(err)
	lenient := outbox.Queue[Charge]{Name: "charge", Codec: outbox.JSONCodec{AllowUnknownFields: true}}
	v, err := lenient.Decode([]byte(`{"order":"order-1001","amount":1250}`))
	fmt.Printf("%+v %v\n", v, err)
	// Output:
	// invalid payload: queue charge: decode outbox_test.Charge: json: unknown field "amount" (a field the type lacks; JSONCodec{AllowUnknownFields: true} ignores such fields)
	// {Order:order-1001 AmountCents:0} <nil>
}
