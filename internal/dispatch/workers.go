package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/delayq/delayq/delayqtype"
)

// The worker process registry: each worker process beats into a hash of its own
// (workerbeat.lua), which expires unless beaten again, and an index ZSET lists
// the processes (WorkerKeys). A process that stops says goodbye (workerbye.lua);
// one that dies without it is listed as lost from its lease after its last beat
// until its hash expires. Nothing here is on a task's path: a process beats once
// per heartbeat interval, whatever it runs.

const (
	// maxWorkerRecord is the largest record a beat writes (the script's limit).
	maxWorkerRecord = 65536
	// maxWorkersListed is the most processes Workers returns.
	maxWorkersListed = 1000
	maxWorkerID      = 64
)

// workerRecord is what a process writes into its hash (field r), in short JSON.
// Started and the last beat are the script's, on the Redis clock.
type workerRecord struct {
	Host     string          `json:"host"`
	PID      int             `json:"pid"`
	Version  string          `json:"version"`
	LeaseMS  int64           `json:"lease_ms"`
	Queues   map[string]int  `json:"queues"`
	InFlight int             `json:"in_flight"`
	Running  []runningRecord `json:"running,omitempty"`
}

// runningRecord is one run in flight.
type runningRecord struct {
	Queue     string `json:"q"`
	ID        string `json:"id"`
	Attempt   int    `json:"a"`
	ClaimedMS int64  `json:"t"` // Unix ms, Redis clock
}

// encodeWorker is the record of w, a process whose lease is lease. Running
// entries past what fits in maxWorkerRecord are left out (InFlight still counts
// them).
func encodeWorker(w delayqtype.Worker, lease time.Duration) ([]byte, error) {
	rec := workerRecord{Host: w.Host, PID: w.PID, Version: w.Version, LeaseMS: ms(lease),
		Queues: w.Queues, InFlight: w.InFlight}
	for _, r := range w.Running {
		rec.Running = append(rec.Running, runningRecord{Queue: r.Queue, ID: r.ID, Attempt: r.Attempt, ClaimedMS: r.ClaimedAt.UnixMilli()})
	}
	for {
		b, err := json.Marshal(rec)
		if err != nil {
			return nil, err
		}
		if len(b) <= maxWorkerRecord {
			return b, nil
		}
		if len(rec.Running) == 0 {
			return nil, fmt.Errorf("%w: worker record of %d bytes (%d queues), at most %d",
				ErrInvalidArgument, len(b), len(rec.Queues), maxWorkerRecord)
		}
		rec.Running = rec.Running[:len(rec.Running)/2]
	}
}

// decodeWorker is the Worker of a record read at now (Unix ms, Redis clock).
func decodeWorker(id, rec string, started, beat, now int64) (delayqtype.Worker, error) {
	var r workerRecord
	if err := json.Unmarshal([]byte(rec), &r); err != nil {
		return delayqtype.Worker{}, replyErr("worker %s: record: %v", id, err)
	}
	w := delayqtype.Worker{
		ID: id, Host: r.Host, PID: r.PID, Version: r.Version,
		Started: time.UnixMilli(started), LastBeat: time.UnixMilli(beat),
		LostAt: time.UnixMilli(beat + r.LeaseMS), Lost: now > beat+r.LeaseMS, ReadAt: time.UnixMilli(now),
		Queues: r.Queues, InFlight: r.InFlight,
	}
	if w.Queues == nil {
		w.Queues = map[string]int{}
	}
	w.Running = make([]struct {
		Queue     string    `json:"queue"`
		ID        string    `json:"id"`
		Attempt   int       `json:"attempt"`
		ClaimedAt time.Time `json:"claimed_at"`
	}, len(r.Running))
	for i, x := range r.Running {
		e := &w.Running[i]
		e.Queue, e.ID, e.Attempt, e.ClaimedAt = x.Queue, x.ID, x.Attempt, time.UnixMilli(x.ClaimedMS)
	}
	return w, nil
}

// BeatWorker writes the heartbeat of process w (ID, Host, PID, Version, Queues,
// InFlight, Running; the times are Redis's) and returns the beat's time. lease is
// how long after this beat the process counts as lost without another; its entry
// expires keep later. Call it once per heartbeat interval, and ByeWorker when the
// process stops.
func (c *Client) BeatWorker(ctx context.Context, w delayqtype.Worker, lease, keep time.Duration) (time.Time, error) {
	if w.ID == "" || len(w.ID) > maxWorkerID {
		return time.Time{}, fmt.Errorf("%w: worker id %q: 1..%d bytes", ErrInvalidArgument, w.ID, maxWorkerID)
	}
	if lease <= 0 || keep < 0 || ms(lease+keep) > maxMS {
		return time.Time{}, fmt.Errorf("%w: worker lease %v, keep %v", ErrInvalidArgument, lease, keep)
	}
	rec, err := encodeWorker(w, lease)
	if err != nil {
		return time.Time{}, err
	}
	index, procs := WorkerKeys(c.cfg.Prefix)
	v, err := c.run(ctx, c.s.workerBeat, []string{index, procs}, w.ID, rec, ms(lease+keep))
	if err != nil {
		return time.Time{}, fmt.Errorf("delayq: worker beat: %w", err)
	}
	now, err := asInt(v, "workerbeat")
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMilli(now), nil
}

// ByeWorker removes process id from the registry (idempotent).
func (c *Client) ByeWorker(ctx context.Context, id string) error {
	if id == "" || len(id) > maxWorkerID {
		return fmt.Errorf("%w: worker id %q: 1..%d bytes", ErrInvalidArgument, id, maxWorkerID)
	}
	index, procs := WorkerKeys(c.cfg.Prefix)
	if _, err := c.run(ctx, c.s.workerBye, []string{index, procs}, id); err != nil {
		return fmt.Errorf("delayq: worker goodbye: %w", err)
	}
	return nil
}

// Workers lists the registered worker processes (at most 1000, the latest beats
// first), each with Lost set by the Redis clock; sorted by host, then start, then
// id. A process that said goodbye, or whose entry expired, is not listed.
func (c *Client) Workers(ctx context.Context) ([]delayqtype.Worker, error) {
	index, procs := WorkerKeys(c.cfg.Prefix)
	v, err := c.run(ctx, c.s.workers, []string{index, procs}, maxWorkersListed)
	if err != nil {
		return nil, fmt.Errorf("delayq: list workers: %w", err)
	}
	a, err := asArray(v, "workers")
	if err != nil {
		return nil, err
	}
	if len(a) < 1 || (len(a)-1)%4 != 0 {
		return nil, replyErr("workers: %d elements", len(a))
	}
	now, err := asInt(a[0], "workers now")
	if err != nil {
		return nil, err
	}
	out := make([]delayqtype.Worker, 0, (len(a)-1)/4)
	for i := 1; i < len(a); i += 4 {
		id, err := asString(a[i], "worker id")
		if err != nil {
			return nil, err
		}
		rec, err := asString(a[i+1], "worker record")
		if err != nil {
			return nil, err
		}
		started, err := asInt(a[i+2], "worker started")
		if err != nil {
			return nil, err
		}
		beat, err := asInt(a[i+3], "worker beat")
		if err != nil {
			return nil, err
		}
		w, err := decodeWorker(id, rec, started, beat, now)
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool {
		x, y := out[i], out[j]
		if x.Host != y.Host {
			return x.Host < y.Host
		}
		if !x.Started.Equal(y.Started) {
			return x.Started.Before(y.Started)
		}
		return x.ID < y.ID
	})
	return out, nil
}
