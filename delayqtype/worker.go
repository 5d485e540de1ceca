package delayqtype

import "time"

// Worker is one worker process as its heartbeat in Redis describes it: each
// process running handlers (delayq.Client.Run) registers itself, beats every
// heartbeat interval and says goodbye when it stops. Client.Workers, the
// `delayq workers` command and the dashboard's Workers page list them. Times are
// by the Redis clock.
type Worker struct {
	// ID is random, drawn when the process's Run starts.
	ID      string `json:"id"`
	Host    string `json:"host"`
	PID     int    `json:"pid"`
	Version string `json:"version"` // delayq's module version in the process
	// Started is the process's first beat, LastBeat its latest.
	Started  time.Time `json:"started"`
	LastBeat time.Time `json:"last_beat"`
	// LostAt is when the process counts as lost if it does not beat again: its
	// last beat plus its lease (WorkerConfig.Lease). Lost says LostAt had passed
	// at ReadAt, when the registry was read: the process is gone without a
	// goodbye (killed, or cut off from Redis). A lost process stays listed for
	// a while (ten minutes), then its entry expires.
	LostAt time.Time `json:"lost_at"`
	Lost   bool      `json:"lost"`
	ReadAt time.Time `json:"read_at"`
	// Queues maps each queue the process has a handler for to its concurrency
	// (QueueConfig.Concurrency).
	Queues map[string]int `json:"queues"`
	// InFlight counts the runs in flight at the last beat. Running lists them,
	// the longest running first, at most 100 (InFlight says how many more).
	// With heartbeats off (WorkerConfig.HeartbeatInterval < 0) Running is empty.
	InFlight int `json:"in_flight"`
	Running  []struct {
		Queue     string    `json:"queue"`
		ID        string    `json:"id"`
		Attempt   int       `json:"attempt"`
		ClaimedAt time.Time `json:"claimed_at"`
	} `json:"running"`
}
