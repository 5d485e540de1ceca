package schedule

import (
	"fmt"

	"github.com/delayq/delayq/outbox"
)

// For declares s as a schedule of the typed queue q, each tick carrying v: it
// sets s.Queue to q's name and s.Payload to v encoded by q's codec (so a
// Queue[struct{}] ticks with "{}", which its strict handler decodes), after
// checking v with T's Validate method if it has one. Declare it beside the
// handler, and give it to the client (delayq.Client.Schedule):
//
//	var Nightly = outbox.Queue[Report]{Name: "reports"}
//	s, err := schedule.For(Nightly, Report{Kind: "nightly"},
//		schedule.Schedule{Name: "nightly-report", Cron: "0 3 * * *", TimeZone: "Europe/Paris"})
//
// The error wraps ErrInvalid: s names another queue, sets a Payload of its own,
// v does not encode or validate (wrapping outbox.ErrInvalidPayload too), or s is
// not a valid schedule.
func For[T any](q outbox.Queue[T], v T, s Schedule) (Schedule, error) {
	if s.Queue != "" && s.Queue != q.Name {
		return Schedule{}, bad("schedule %s: names queue %q, declared for queue %q", s.Name, s.Queue, q.Name)
	}
	if s.Payload != nil {
		return Schedule{}, bad("schedule %s: a Payload and a typed value; the value is the payload", s.Name)
	}
	t, err := q.Task(outbox.Task{}, v)
	if err != nil {
		return Schedule{}, fmt.Errorf("%w: schedule %s: %w", ErrInvalid, s.Name, err)
	}
	s.Queue, s.Payload = q.Name, t.Payload
	if err := s.validate(); err != nil {
		return Schedule{}, err
	}
	return s, nil
}
