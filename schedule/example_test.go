package schedule_test

import (
	"fmt"
	"time"

	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/schedule"
)

// Report is what the nightly report's handler gets.
type Report struct {
	Kind string `json:"kind"`
}

// A typed schedule, declared beside the handler of its queue: the queue names
// it, its codec writes the payload. Give it to the client (Client.Schedule).
func ExampleFor() {
	reports := outbox.Queue[Report]{Name: "reports"}
	nightly, err := schedule.For(reports, Report{Kind: "nightly"},
		schedule.Schedule{Name: "nightly-report", Cron: "0 3 * * *", TimeZone: "Europe/Paris"})
	if err != nil {
		panic(err)
	}
	fmt.Println(nightly.Queue, string(nightly.Payload))

	// A queue of empty values ticks with "{}", which its handler decodes.
	pings := outbox.Queue[struct{}]{Name: "ping"}
	ping, err := schedule.For(pings, struct{}{}, schedule.Schedule{Name: "ping", Every: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	fmt.Println(ping.Queue, string(ping.Payload))
	// Output:
	// reports {"kind":"nightly"}
	// ping {}
}
