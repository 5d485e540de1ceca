package delayq

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
)

// maxWeight is the largest weight of a queue in a PriorityGroup.
const maxWeight = 1000

// PriorityGroup makes several queues of a Client share one pool of slots and
// orders their claims by weight, as asynq's Queues and StrictPriority do. Whenever
// slots of the group come free, they go to the group's queues that have tasks due:
//
//   - weighted (the default): by smooth weighted round robin, slot by slot. With a
//     backlog in every queue, a queue gets weight/(sum of weights) of the starts
//     (weights 6:3:1: 60 %, 30 %, 10 %), so a queue of low weight is never
//     starved. A queue with nothing due takes no turn; its share goes to the
//     others until it has tasks due again.
//   - Strict: to the queue of highest weight that has tasks due; a lower queue runs
//     only while every higher one has nothing due (or is at its own Concurrency).
//     A steady backlog in a higher queue starves the lower ones, by design.
//
// Queues not in a group keep their own slots (QueueConfig.Concurrency) and claim on
// their own, as before. Weights order claims, not running handlers: a long run of a
// low queue holds its slot until it returns.
type PriorityGroup struct {
	// Queues maps each queue of the group to its weight, 1..1000. Every queue must
	// have its handler registered (Handle, HandleTx...) before Prioritize, and be
	// in one group at most. At least one queue.
	Queues map[string]int

	// Strict gives free slots to the queue of highest weight with tasks due, as
	// asynq's StrictPriority (equal weights in name order). Default false:
	// weighted round robin.
	Strict bool

	// Concurrency is how many handlers of the group's queues run at once, all
	// queues together. Each queue's own QueueConfig.Concurrency still caps its
	// runs. Default 10; 1..1000.
	Concurrency int
}

// WithDefaults returns a copy of g with zero fields set to their defaults.
func (g PriorityGroup) WithDefaults() PriorityGroup {
	if g.Concurrency == 0 {
		g.Concurrency = 10
	}
	return g
}

// Validate reports whether g, with its defaults, is a valid group on its own
// (Prioritize also checks its queues against the registered ones).
func (g PriorityGroup) Validate() error { return g.WithDefaults().validate() }

func (g PriorityGroup) validate() error {
	if len(g.Queues) == 0 {
		return fmt.Errorf("%w: PriorityGroup without queues", ErrInvalidConfig)
	}
	if g.Concurrency < 1 || g.Concurrency > maxConcurrency {
		return fmt.Errorf("%w: PriorityGroup.Concurrency %d: 1..%d", ErrInvalidConfig, g.Concurrency, maxConcurrency)
	}
	for _, name := range sortedNames(g.Queues) {
		if w := g.Queues[name]; w < 1 || w > maxWeight {
			return fmt.Errorf("%w: PriorityGroup: queue %q weight %d: 1..%d", ErrInvalidConfig, name, w, maxWeight)
		}
	}
	return nil
}

func sortedNames(m map[string]int) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Prioritize puts registered queues into one priority group (see PriorityGroup).
// Call it after registering their handlers and before Run. A queue named in no
// handler is ErrInvalidQueue; a bad group, or a queue already in a group, is
// ErrInvalidConfig.
func (w *worker) Prioritize(g PriorityGroup) error {
	g = g.WithDefaults()
	if err := g.validate(); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running {
		return fmt.Errorf("%w: prioritize before Run", ErrRunning)
	}
	pg := &prioGroup{cfg: g}
	for _, name := range sortedNames(g.Queues) {
		q, ok := w.queues[name]
		switch {
		case !ok:
			return fmt.Errorf("%w: PriorityGroup: no handler registered for queue %q", ErrInvalidQueue, name)
		case q.prio != nil:
			return fmt.Errorf("%w: PriorityGroup: queue %q is in a group already", ErrInvalidConfig, name)
		}
		pg.members = append(pg.members, &prioQueue{q: q, weight: g.Queues[name]})
	}
	if g.Strict {
		sort.SliceStable(pg.members, func(i, j int) bool { return pg.members[i].weight > pg.members[j].weight })
	}
	for _, m := range pg.members {
		m.q.prio = pg
	}
	w.prio = append(w.prio, pg)
	return nil
}

// prioGroup is a PriorityGroup as Run uses it. Its members' scheduling fields are
// owned by the group's claim loop; only inFlight is shared with the runs (slots.mu).
type prioGroup struct {
	cfg     PriorityGroup
	members []*prioQueue // Strict: by weight, highest first; else by name
}

type prioQueue struct {
	q      *queue
	weight int

	current  int // smooth weighted round robin's credit
	inFlight int // runs holding a slot of the group (slots.mu)

	// idle: the last claim found nothing more due (or failed); the queue takes no
	// turn until, or until a wake-up after mark (when marked).
	idle   bool
	until  time.Time
	mark   dispatch.Mark
	marked bool
}

// slots is a group's pool of slots.
type slots struct {
	mu    sync.Mutex
	free  int
	freed chan struct{} // a slot came free (capacity 1, never blocks)
}

func (s *slots) take(m *prioQueue, n int) {
	s.mu.Lock()
	s.free -= n
	m.inFlight += n
	s.mu.Unlock()
}

func (s *slots) put(m *prioQueue, n int) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	s.free += n
	m.inFlight -= n
	s.mu.Unlock()
	select {
	case s.freed <- struct{}{}:
	default:
	}
}

// groupLoop claims the tasks of g's queues while ctx lasts, in the group's order,
// and starts a run for each: the claim loop of a priority group.
func (w *worker) groupLoop(ctx, hard context.Context, waiter *dispatch.Waiter, g *prioGroup, runs *runners) {
	s := &slots{free: g.cfg.Concurrency, freed: make(chan struct{}, 1)}
	plan := make([]int, len(g.members))
	room := make([]int, len(g.members))
	for ctx.Err() == nil {
		now := time.Now()
		s.mu.Lock()
		free := s.free
		for i, m := range g.members {
			room[i] = 0
			if m.ready(waiter, now) {
				room[i] = m.q.cfg.Concurrency - m.inFlight
			}
		}
		s.mu.Unlock()
		if g.plan(plan, room, free) == 0 {
			w.groupWait(ctx, waiter, g, s)
			continue
		}
		for i, n := range plan {
			if n > 0 && ctx.Err() == nil {
				w.groupClaim(ctx, hard, waiter, g.members[i], n, s, runs)
			}
		}
	}
}

// ready reports whether m may take a turn: not idle, or its idle time is over, or
// a wake-up came for its queue.
func (m *prioQueue) ready(waiter *dispatch.Waiter, now time.Time) bool {
	if !m.idle {
		return true
	}
	if !now.Before(m.until) {
		m.idle = false
		return true
	}
	if m.marked {
		select {
		case <-waiter.Woken(m.mark):
			m.idle = false
			return true
		default:
		}
	}
	return false
}

// plan shares free slots among the members with room (room[i] > 0: the queue may
// have tasks due and is below its own Concurrency) into plan, and returns the
// number given.
func (g *prioGroup) plan(plan, room []int, free int) int {
	clear(plan)
	given := 0
	if g.cfg.Strict {
		for i := range g.members {
			n := min(room[i], free-given)
			plan[i] = n
			given += n
		}
		return given
	}
	// Smooth weighted round robin (as nginx's upstreams), one slot at a time over
	// the members with room left: each gains its weight, the richest takes the
	// slot and pays the total.
	for given < free {
		best, total := -1, 0
		for i, m := range g.members {
			if plan[i] >= room[i] {
				continue
			}
			m.current += m.weight
			total += m.weight
			if best < 0 || m.current > g.members[best].current {
				best = i
			}
		}
		if best < 0 {
			break
		}
		g.members[best].current -= total
		plan[best]++
		given++
	}
	return given
}

// groupClaim claims up to n tasks of m's queue on n slots of s and starts their runs.
func (w *worker) groupClaim(ctx, hard context.Context, waiter *dispatch.Waiter, m *prioQueue, n int, s *slots, runs *runners) {
	q := m.q
	s.take(m, n)
	mark, err := waiter.Mark(ctx, q.name)
	if err != nil {
		s.put(m, n)
		if ctx.Err() == nil {
			w.storeFailed(w.rd, "subscribe to wake-ups", err, "queue", q.name)
			m.sleep(w.cfg.ErrorPause, dispatch.Mark{}, false)
		}
		return
	}
	// The claim outlives ctx, as in claimLoop.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.OpTimeout)
	cl, err := w.dq.Claim(cctx, q.name, n, w.cfg.Lease)
	cancel()
	w.obs.Claim(ctx, ClaimEvent{Queue: q.name, Asked: n, Claimed: len(cl.Tasks), Err: err})
	if err != nil {
		s.put(m, n)
		w.storeFailed(w.rd, "claim", err, "queue", q.name)
		m.sleep(w.cfg.ErrorPause, dispatch.Mark{}, false)
		return
	}
	w.rd.OK()
	s.put(m, n-len(cl.Tasks))
	for _, ct := range cl.Tasks {
		slot := sync.OnceFunc(func() { s.put(m, 1) })
		if q.group != nil && !ct.Missed {
			q.group.add(w.startRun(hard, q, ct, cl.Now, slot))
			continue
		}
		runs.Go(func() { w.start(hard, q, ct, cl.Now, slot) })
	}
	switch {
	case cl.RateWait > 0:
		m.sleep(cl.RateWait, mark, true)
	case cl.NextDue > 0:
		m.sleep(approach(cl.NextDue), mark, true)
	case cl.NextDue < 0:
		m.sleep(waiter.MaxWait(), mark, true)
	}
}

// sleep makes m take no turn for d, or until a wake-up after mark.
func (m *prioQueue) sleep(d time.Duration, mark dispatch.Mark, marked bool) {
	m.idle, m.until, m.mark, m.marked = true, time.Now().Add(d), mark, marked
}

// groupWait sleeps until a slot comes free, an idle queue's time is over or its
// wake-up arrives, or ctx ends.
func (w *worker) groupWait(ctx context.Context, waiter *dispatch.Waiter, g *prioGroup, s *slots) {
	cases := []reflect.SelectCase{
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(s.freed)},
	}
	var until time.Time
	for _, m := range g.members {
		if !m.idle {
			continue
		}
		if until.IsZero() || m.until.Before(until) {
			until = m.until
		}
		if m.marked {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(waiter.Woken(m.mark))})
		}
	}
	if !until.IsZero() {
		t := time.NewTimer(time.Until(until))
		defer t.Stop()
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(t.C)})
	}
	reflect.Select(cases)
}
