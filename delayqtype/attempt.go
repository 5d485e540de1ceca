package delayqtype

import "time"

// Attempt is one run of a task in its attempt history (delayq.Client.Attempts,
// the dashboard's task page, delayq task show), oldest first. The outbox row keeps
// the runs that did not succeed, at most its newest 20 and 64 KiB (each error cut
// to 1 KiB, a stack to 8 KiB), and is pruned with them; a success writes nothing
// there, so it is derived from the row: the run after the last one recorded, at
// the time the row became done.
type Attempt struct {
	// Attempt is the run's number within Version, 1 for the first (a task retried
	// from dead is a new version and counts from 1 again).
	Attempt int `json:"attempt"`
	// Version is the task's version the run held.
	Version int `json:"version"`
	// At is when the outcome was recorded, on the database's clock.
	At time.Time `json:"at"`
	// Outcome is how the run ended: "retried" (failed, runs again after a
	// backoff), "dead" (failed with no attempt left, or told not to retry),
	// "cancelled" (the handler cancelled its task), "lease_lost" (failed after
	// the worker had lost its lease: another run decided), "lease_expired" (the
	// last attempt's lease expired, its worker gone: the reaper declared the task
	// dead) or "succeeded".
	Outcome string `json:"outcome"`
	// Error is the run's error ("" for a success).
	Error string `json:"error,omitempty"`
	// Stack is the stack of a run that panicked ("" otherwise).
	Stack string `json:"stack,omitempty"`
}
