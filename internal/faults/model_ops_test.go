package faults

// The model's operations added after it was written (issue 29, deliverable 7):
// queue controls (pause, resume and rate limits, checked against every run's
// claim time), enqueues whose transactions stay open after a notifier's commit
// (the producer's notification cooldown), and a Redis loss while no relay runs.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// queue is a queue for an operation that is not about shards: ma or mb.
func (m *model) queue() string { return modelBusyQueues[m.rng.IntN(len(modelBusyQueues))] }

// opShardedBurst commits 2-5 tasks due now into the sharded queue, one
// transaction each.
func (m *model) opShardedBurst(ctx context.Context) {
	for range 2 + m.rng.IntN(4) {
		m.enqueueOne(ctx, modelShardQueue, 0, true)
	}
}

// opReshard purges the sharded queue's dead tasks, then changes its shard count
// (1..4) through the one operation, which refuses while a task of the queue is
// pending, queued or dead in Postgres, or in Redis. Tasks enqueued after a change
// go to the new layout's shards, where every worker must find them: a worker
// learns the count on its next claim.
func (m *model) opReshard(ctx context.Context) {
	m.purgeDead(ctx, modelShardQueue)
	ctl, err := queuectl.New(m.s.admin, m.s.dq, m.s.ob.Config().Schema)
	if err != nil {
		m.s.t.Fatal(err)
	}
	n := 1 + m.rng.IntN(4)
	switch c, err := ctl.SetShards(ctx, modelShardQueue, n); {
	case errors.Is(err, taskstate.ErrQueueNotEmpty):
		m.logf(nil, "reshard %s to %d: refused, not empty", modelShardQueue, n)
	case err != nil:
		m.s.t.Fatalf("reshard %s to %d: %v", modelShardQueue, n, err)
	default:
		m.ops["(resharded)"]++
		m.logf(nil, "reshard %s to %d: version %d", modelShardQueue, n, c.Version)
	}
}

// controlSpan is a time a queue's controls held, by the Redis clock: from just
// after the write that set them reached Redis to just before the write that
// lifted them.
type controlSpan struct {
	queue    string
	from, to time.Time
	paused   bool
	rate     validate.RateLimit // Limit 0 while paused
}

// redisNow is the Redis clock, the one claims are timed by.
func (m *model) redisNow(ctx context.Context) time.Time {
	now, err := m.s.rdb.Time(ctx).Result()
	if err != nil {
		m.s.t.Fatalf("Redis TIME: %v", err)
	}
	return now
}

// setControls changes a queue's controls through the one operation
// (internal/queuectl): Postgres, the truth, commits; then Redis's versioned copy.
func (m *model) setControls(ctx context.Context, q string, paused bool, rate validate.RateLimit) {
	ctl, err := queuectl.New(m.s.admin, m.s.dq, m.s.ob.Config().Schema)
	if err != nil {
		m.s.t.Fatal(err)
	}
	if paused {
		_, err = ctl.Pause(ctx, q)
	} else {
		_, err = ctl.Resume(ctx, q)
	}
	if err != nil {
		m.s.t.Fatalf("pause %s %v: %v", q, paused, err)
	}
	if _, err := ctl.SetRateLimit(ctx, q, rate); err != nil {
		m.s.t.Fatalf("rate limit %s: %v", q, err)
	}
}

// opPause pauses a queue for 0.3-1.5 s, then resumes it. No claim of the queue
// may fall inside the pause (checkControls).
func (m *model) opPause(ctx context.Context) {
	q := m.queue()
	hold := time.Duration(300+m.rng.IntN(1200)) * time.Millisecond
	m.setControls(ctx, q, true, validate.RateLimit{})
	sp := controlSpan{queue: q, from: m.redisNow(ctx), paused: true}
	pause(ctx, hold)
	sp.to = m.redisNow(ctx)
	m.setControls(ctx, q, false, validate.RateLimit{})
	m.spans = append(m.spans, sp)
	m.logf(nil, "pause %s for %v", q, hold)
}

// opRateLimit limits a queue's starts for 1-2.5 s, then lifts the limit. No
// window of a period may hold more claims than the limit allows (checkControls).
func (m *model) opRateLimit(ctx context.Context) {
	q := m.queue()
	rate := validate.RateLimit{Limit: 5 + m.rng.IntN(20), Period: time.Second, Burst: 1 + m.rng.IntN(4)}
	hold := time.Duration(1000+m.rng.IntN(1500)) * time.Millisecond
	m.setControls(ctx, q, false, rate)
	sp := controlSpan{queue: q, from: m.redisNow(ctx), rate: rate}
	// A backlog due now, more than the limit lets start in the hold: without the
	// limit the workers would claim it at once.
	start := time.Now()
	for range rate.Burst + rate.Limit + 3 {
		m.enqueueOne(ctx, q, 0, true)
	}
	pause(ctx, hold-time.Since(start))
	sp.to = m.redisNow(ctx)
	m.setControls(ctx, q, false, validate.RateLimit{})
	m.spans = append(m.spans, sp)
	m.logf(nil, "rate limit %s %d per %v burst %d for %v", q, rate.Limit, rate.Period, rate.Burst, hold)
}

// opHeldOpen commits an enqueue at once (it notifies the relay), then, a few
// milliseconds later, enqueues into the same queue in a transaction held open
// for up to 2 s: within the producer's cooldown its statement may leave its
// notification out, and the task must reach Redis all the same.
func (m *model) opHeldOpen(ctx context.Context) {
	q := m.queue()
	m.enqueueOne(ctx, q, 0, false)
	pause(ctx, time.Duration(m.rng.IntN(15))*time.Millisecond)
	m.enqueueOne(ctx, q, time.Duration(m.rng.IntN(2000))*time.Millisecond, false)
}

// enqueueOne commits one new task of q (due now, or at a random delay), through
// Enqueue (the path with the notification cooldown), after holding its
// transaction open for hold.
func (m *model) enqueueOne(ctx context.Context, q string, hold time.Duration, now bool) {
	m.nextID++
	t := &mtask{q: q, id: fmt.Sprintf("h%04d", m.nextID)}
	d, what := m.delay()
	if now {
		d, what = 0, "now"
	}
	ma := 2 + m.rng.IntN(4)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := m.s.admin.Begin(ctx)
	if err != nil {
		m.s.t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after the commit
	r, err := m.s.ob.Enqueue(ctx, tx, outbox.Task{Queue: q, ID: t.id, Payload: modelPayload(1), Delay: d, MaxAttempts: ma, Priority: modelPriority(t.id)})
	if err != nil {
		m.s.t.Fatalf("enqueue %s: %v", t.key(), err)
	}
	pause(ctx, hold)
	if err := tx.Commit(ctx); err != nil {
		m.s.t.Fatalf("commit: %v", err)
	}
	m.tasks[t.key()] = t
	m.order = append(m.order, t)
	if r.Duplicate {
		m.violation(t, "new task reported a duplicate")
		return
	}
	m.begin(t, ma, r.RunAt)
	m.logf(t, "enqueue %s delay %v (%s) max %d, held open %v: run_at %s", t.key(), d, what, ma, hold, stamp(r.RunAt))
}

// opRedisLossRelayDown loses Redis's data while no relay runs, commits tasks
// (and maybe a reschedule) meanwhile, then starts the relay again. Nothing
// reconciles: the relay's self-healing must find the loss and repair Redis, and
// its first rounds must put the new tasks where claims look for them (a sharded
// queue's tasks in their own shards).
func (m *model) opRedisLossRelayDown(ctx context.Context) {
	m.relays.holdDown()
	from := time.Now()
	if err := m.s.rdb.FlushAll(ctx).Err(); err != nil {
		m.s.t.Fatalf("FLUSHALL: %v", err)
	}
	m.losses = append(m.losses, struct{ from, to time.Time }{from, time.Now()})
	for _, t := range m.order {
		t.flushed = true
	}
	m.logf(nil, "relay held down; Redis FLUSHALL")
	for range 1 + m.rng.IntN(3) {
		m.opEnqueue(ctx)
	}
	if m.rng.IntN(2) == 0 {
		m.opReschedule(ctx)
	}
	pause(ctx, time.Duration(100+m.rng.IntN(400))*time.Millisecond)
	m.relays.release()
	m.logf(nil, "relay released")
}

// checkControls finds the runs claimed against the controls that held then: any
// claim inside a pause, or more claims in a window of one period than the limit
// allows (GCRA: Burst + Limit a period; each of a sharded queue's n shards takes
// Limit/n a period with a burst of at least 1).
func (m *model) checkControls(v *violations, runs map[key][]modelRun) {
	type claim struct {
		at   time.Time
		what string
	}
	// One claim may start its handler more than once: a batched transaction
	// that a guard refused in part runs the others' handlers again, under the
	// same claim (delayq/group.go). The limits count claims.
	claims := map[string][]claim{}
	for k, rs := range runs {
		seen := map[string]bool{}
		for _, r := range rs {
			what := fmt.Sprintf("%s v%d attempt %d by %s", k, r.version, r.attempt, r.worker)
			if id := what + " " + r.claimedAt.String(); !seen[id] {
				seen[id] = true
				claims[k.queue] = append(claims[k.queue], claim{r.claimedAt, what})
			}
		}
	}
	for _, c := range claims {
		slices.SortFunc(c, func(a, b claim) int { return a.at.Compare(b.at) })
	}
	shards := max(m.s.shards, 1)
	for _, sp := range m.spans {
		var in []claim
		for _, c := range claims[sp.queue] {
			if c.at.After(sp.from) && c.at.Before(sp.to) {
				in = append(in, c)
			}
		}
		if sp.paused {
			if len(in) > 0 {
				v.add("controls", "%s paused %s..%s: %d claims in the pause, the first at %s (%s)%s",
					sp.queue, stamp(sp.from), stamp(sp.to), len(in), stamp(in[0].at), in[0].what, m.opsBetween(sp.from, sp.to))
			}
			continue
		}
		allowed := max(sp.rate.Burst, shards) + sp.rate.Limit
		for i := range in {
			j := i
			for j < len(in) && in[j].at.Sub(in[i].at) < sp.rate.Period {
				j++
			}
			if j-i > allowed {
				lines := make([]string, 0, j-i)
				for _, c := range in[i:j] {
					lines = append(lines, stamp(c.at)+" "+c.what)
				}
				v.add("controls", "%s limited to %d per %v (burst %d) %s..%s: %d claims within %v of %s:\n      %s%s",
					sp.queue, sp.rate.Limit, sp.rate.Period, sp.rate.Burst, stamp(sp.from), stamp(sp.to), j-i, sp.rate.Period, stamp(in[i].at),
					strings.Join(lines, "\n      "), m.opsBetween(sp.from, sp.to))
				break
			}
		}
	}
}

// opsBetween lists the logged operations from a second before from to to (the
// Redis clock and the model's are this machine's), for a violation's context.
func (m *model) opsBetween(from, to time.Time) string {
	lo, hi := from.Add(-time.Second).Sub(m.start).Seconds(), to.Sub(m.start).Seconds()
	var b strings.Builder
	for _, line := range m.oplog {
		var at float64
		if _, err := fmt.Sscanf(line, "%fs", &at); err == nil && at >= lo && at <= hi {
			b.WriteString("\n      op " + line)
		}
	}
	return b.String()
}

// opPostgresCrash commits a task due within the horizon, waits for the relay to
// queue it (its round commits without waiting for the disk), SIGKILLs every
// Postgres process and starts the server again (crash recovery may lose the
// round), then reschedules the task. The relay moves a lost round's rows again,
// and the reschedule's new version must replace the copy in Redis either way.
func (m *model) opPostgresCrash(ctx context.Context) {
	m.enqueueOne(ctx, m.queue(), 0, false)
	t := m.order[len(m.order)-1]
	queued := false
	for range 40 {
		var st string
		if err := m.s.admin.QueryRow(ctx, `SELECT state FROM delayq_outbox WHERE queue = $1 AND task_id = $2`, t.q, t.id).Scan(&st); err != nil {
			m.s.t.Fatalf("read %s: %v", t.key(), err)
		}
		if queued = st != "pending"; queued || !pause(ctx, 50*time.Millisecond) {
			break
		}
	}
	crashed := time.Now()
	m.pg.Kill()
	if err := m.pg.Start(ctx); err != nil {
		m.s.t.Fatalf("start Postgres after the crash: %v", err)
	}
	m.s.admin.Reset() // its connections died with the server
	for i := 0; ; i++ {
		err := m.s.admin.Ping(ctx)
		if err == nil {
			break
		}
		if i == 100 || !pause(ctx, 100*time.Millisecond) {
			m.s.t.Fatalf("Postgres after the crash: %v", err)
		}
	}
	// Runs in flight failed on the crash with outcomes the plan did not choose,
	// and so may runs for a while after it: a worker's pooled connection that
	// died with the server fails its next use (pgxpool pings only connections
	// idle for a second). The model takes it as a worker's SIGKILL two seconds
	// after the restart (seed 12063338160590389825: a task enqueued 180 ms after
	// the restart lost its first run's planned outcome).
	m.kills = append(m.kills, time.Now().Add(2*time.Second))
	m.pgCrashes = append(m.pgCrashes, struct{ from, to time.Time }{crashed, time.Now().Add(2 * time.Second)})
	m.logf(t, "Postgres crash (task queued first: %v), restarted in %v", queued, time.Since(crashed).Round(time.Millisecond))
	if t.k == kOpen {
		m.reschedule(ctx, t)
	}
}
