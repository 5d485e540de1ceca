package delayq

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"runtime/debug"
	"sort"
	"time"

	"github.com/delayq/delayq/delayqtype"
)

// registry keeps this process in the worker registry in Redis while Run runs
// (dispatch's BeatWorker): who it is, its queues and what it runs, so an operator
// sees the workers and what each is doing (Client.Workers, `delayq workers`, the
// dashboard's Workers page). One loop per process beats every Lease/3 and reads
// the runs in flight from the heartbeats' map at that moment: a run costs the
// registry nothing. The entry is deleted when Run ends; a process that dies
// without that goodbye shows as lost a lease after its last beat, and its entry
// expires workerKeep later.
type registry struct {
	w     *worker
	every time.Duration
	keep  time.Duration
	self  delayqtype.Worker // the fields that do not change: ID, Host, PID, Version, Queues
}

const (
	// workerKeep is how long a lost process stays listed.
	workerKeep = 10 * time.Minute
	// maxRunningListed is the most runs in flight a beat lists (the longest
	// running); InFlight counts them all.
	maxRunningListed = 100
	// minRegistryBeat floors the beat interval of a worker with a tiny lease.
	minRegistryBeat = 10 * time.Millisecond
)

func newRegistry(w *worker, queues []*queue) *registry {
	host, _ := os.Hostname()
	self := delayqtype.Worker{
		ID: newWorkerID(), Host: host, PID: os.Getpid(), Version: moduleVersion(),
		Queues: make(map[string]int, len(queues)),
	}
	for _, q := range queues {
		self.Queues[q.name] = q.cfg.Concurrency
	}
	keep := workerKeep
	if w.hooks.workerKeep > 0 {
		keep = w.hooks.workerKeep
	}
	return &registry{w: w, every: max(w.cfg.Lease/3, minRegistryBeat), keep: keep, self: self}
}

// startRegistry registers the process (one beat, before it returns) and beats
// until the returned stop, which says goodbye: call it once no run is left. The
// beats and the goodbye outlive ctx (Run's), as the runs do.
func (w *worker) startRegistry(ctx context.Context, queues []*queue) (stop func()) {
	g := newRegistry(w, queues)
	ctx = context.WithoutCancel(ctx)
	beats, cancel := context.WithCancel(ctx)
	// The first beat before the first claim: a run is never in flight in an
	// unregistered process. (A Redis that fails it fails the claims too.)
	err := g.beat(beats)
	if err != nil {
		w.log.Warn("worker: registry beat failed", "id", g.self.ID, "err", err)
	}
	done := make(chan struct{})
	go func() { g.loop(beats, err != nil); close(done) }()
	return func() {
		cancel()
		<-done
		if w.hooks.noGoodbye {
			return
		}
		bctx, cancel := context.WithTimeout(ctx, w.cfg.OpTimeout)
		defer cancel()
		if err := w.dq.ByeWorker(bctx, g.self.ID); err != nil {
			w.log.Warn("worker: leave the worker registry failed", "id", g.self.ID, "err", err)
		}
	}
}

// loop beats every g.every until ctx is done; failing says the last beat
// failed (startRegistry's first one).
func (g *registry) loop(ctx context.Context, failing bool) {
	tick := time.NewTicker(g.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := g.beat(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
			return
		case err != nil && !failing:
			g.w.log.Warn("worker: registry beat failed", "id", g.self.ID, "err", err)
		case err == nil && failing:
			g.w.log.Info("worker: registry beat works again", "id", g.self.ID)
		}
		failing = err != nil
	}
}

// beat writes the process's heartbeat.
func (g *registry) beat(ctx context.Context) error {
	bctx, cancel := context.WithTimeout(ctx, min(g.w.cfg.OpTimeout, g.every))
	defer cancel()
	_, err := g.w.dq.BeatWorker(bctx, g.snapshot(), g.w.cfg.Lease, g.keep)
	return err
}

// snapshot is the process as the next beat describes it.
func (g *registry) snapshot() delayqtype.Worker {
	w := g.self
	w.InFlight = int(g.w.stats.inFlight.Load())
	runs := g.w.beats.inFlight()
	sort.Slice(runs, func(i, j int) bool {
		if !runs[i].ClaimedAt.Equal(runs[j].ClaimedAt) {
			return runs[i].ClaimedAt.Before(runs[j].ClaimedAt)
		}
		return runs[i].ID < runs[j].ID
	})
	runs = runs[:min(len(runs), maxRunningListed)]
	w.Running = make([]struct {
		Queue     string    `json:"queue"`
		ID        string    `json:"id"`
		Attempt   int       `json:"attempt"`
		ClaimedAt time.Time `json:"claimed_at"`
	}, len(runs))
	for i, t := range runs {
		e := &w.Running[i]
		e.Queue, e.ID, e.Attempt, e.ClaimedAt = t.Queue, t.ID, t.Attempt, t.ClaimedAt
	}
	return w
}

// inFlight returns the tasks of the runs whose leases the heartbeats renew: every
// run in flight, unless heartbeats are off (then none). The Tasks are the runs'
// own: read them, do not change them.
func (h *heartbeats) inFlight() []*Task {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*Task, 0, len(h.runs))
	for r := range h.runs {
		out = append(out, r.t)
	}
	return out
}

func newWorkerID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// modulePath is delayq's module path, whose version the registry reports.
const modulePath = "github.com/delayq/delayq"

// moduleVersion is the version of delayq built into this process: the module
// version a program requires, or, in a build of delayq's own tree, its version
// and commit (the delayq command).
func moduleVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown" // built without module support
	}
	if bi.Main.Path != modulePath {
		for _, d := range bi.Deps {
			if d.Path == modulePath {
				if d.Replace != nil {
					return cmp.Or(d.Replace.Version, "(devel)")
				}
				return d.Version
			}
		}
		return "(devel)" // a workspace's or a replaced module's build
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
	}
	return v
}
