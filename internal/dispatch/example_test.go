package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
)

// A claimer loop: mark, claim, handle, complete; sleep with the Waiter when nothing
// is due. (It needs a Redis server, so it is compiled, not run.)
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()

	c, err := dispatch.New(rdb, dispatch.Config{}) // prefix "dq"; a done task is deleted at Complete
	if err != nil {
		log.Fatal(err)
	}
	// Normally the relay moves tasks from the Postgres outbox; here we enqueue directly.
	st, err := c.Enqueue(ctx, "payment", dispatch.Task{
		ID:      "order-1001",
		Payload: []byte(`{"amount":4200}`),
		RunAt:   time.Now().Add(50 * time.Millisecond),
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("enqueue:", st[0]) // added; a second call would say duplicate

	w := c.NewWaiter()
	defer w.Close()
	for {
		m, err := w.Mark(ctx, "payment")
		if err != nil {
			log.Fatal(err)
		}
		cl, err := c.Claim(ctx, "payment", 10, 30*time.Second)
		if err != nil {
			log.Fatal(err)
		}
		if len(cl.Tasks) == 0 {
			if err := w.Wait(ctx, m, cl.NextDue); err != nil {
				log.Fatal(err)
			}
			continue
		}
		for _, t := range cl.Tasks {
			fmt.Printf("run %s (attempt %d, %v late)\n", t.ID, t.Attempt, cl.Now.Sub(t.Due))
			err := c.Complete(ctx, t.Queue, t.ID, t.Token)
			if errors.Is(err, dispatch.ErrLeaseLost) {
				continue // reaped or rescheduled meanwhile: Postgres' guard decides
			}
			if err != nil {
				log.Fatal(err)
			}
		}
		return
	}
}
