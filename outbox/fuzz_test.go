package outbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

func FuzzValidate(f *testing.F) {
	f.Add("payment", "order-1001", 20, int64(0), int64(0), 0, 0, int64(0))
	f.Add("", "", 0, int64(-1), int64(-1), -1, -1, int64(-1))
	f.Add("a{b}", "x}", 70000, int64(time.Hour), int64(1), 1<<31, 10, int64(1e15))
	f.Add("q", "id", 0, int64(time.Second), int64(2000000000), 3, 9, int64(1999999999000))
	f.Add("q", "id", 0, int64(0), int64(2000000000), 0, 0, int64(2000000000000))
	c, err := outbox.New(outbox.Config{})
	if err != nil {
		f.Fatal(err)
	}
	sentinels := []error{
		outbox.ErrInvalidQueue, outbox.ErrInvalidTaskID, validate.ErrInvalidDelay,
		validate.ErrInvalidRunAt, outbox.ErrPayloadTooLarge, validate.ErrInvalidMaxAttempts, validate.ErrInvalidPriority,
		validate.ErrInvalidStartBy,
	}
	f.Fuzz(func(t *testing.T, queue, id string, payloadLen int, delay, runAtUnix int64, maxAttempts, priority int, startByMS int64) {
		task := outbox.Task{
			Queue:       queue,
			ID:          id,
			Payload:     make([]byte, min(max(payloadLen, 0), 1<<17)),
			Delay:       time.Duration(delay),
			MaxAttempts: maxAttempts,
			Priority:    priority,
		}
		if runAtUnix != 0 {
			task.RunAt = time.Unix(runAtUnix, 0)
		}
		if startByMS != 0 {
			task.StartBy = time.UnixMilli(startByMS)
		}
		err := c.Validate(task)
		if err != nil {
			n := 0
			for _, s := range sentinels {
				if errors.Is(err, s) {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("error %v matches %d sentinels, want exactly one", err, n)
			}
			if len(err.Error()) > 400 {
				t.Fatalf("error of %d bytes", len(err.Error()))
			}
			return
		}
		// Accepted: every rule holds.
		if validate.Queue(queue) != nil || validate.TaskID(id) != nil {
			t.Fatalf("accepted queue %q, id %q", queue, id)
		}
		if task.Delay < 0 || len(task.Payload) > validate.DefaultMaxPayloadBytes ||
			maxAttempts < 0 || maxAttempts > 1<<31-1 || priority < 0 || priority > 9 {
			t.Fatalf("accepted %+v", task)
		}
		if !task.RunAt.IsZero() && (task.Delay != 0 || task.RunAt.Unix() <= 0 || task.RunAt.Year() > 9999) {
			t.Fatalf("accepted run-at %v with delay %v", task.RunAt, task.Delay)
		}
		// The statement checks a deadline against now plus the delay; Validate
		// against what it knows: the range and the run-at.
		if !task.StartBy.IsZero() && (startByMS <= 0 || startByMS > 1e14 || task.StartBy.Before(task.RunAt)) {
			t.Fatalf("accepted start deadline %v with run-at %v", task.StartBy, task.RunAt)
		}
	})
}
