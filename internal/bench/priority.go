package bench

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
)

// priorityWeights are the priority workload's queues and weights.
var priorityWeights = []struct {
	name   string
	weight int
}{{"high", 6}, {"mid", 3}, {"low", 1}}

// priorityWorkers and prioritySlots: the workers serving the group, and the
// group's slots in each.
const (
	priorityWorkers = 2
	prioritySlots   = 16
)

// priority: a backlog of 10,000 tasks in each of three queues weighted 6:3:1 in one
// priority group, 2 workers of 16 shared slots each, a no-op plain handler; the
// share of each queue among the first 10,000 starts (every queue still has a
// backlog then: high needs 6,000), and its error relative to the weight's share.
func priority(ctx context.Context, s *session, r *Result) error {
	// At least 1,000 a queue even at CI's tiny scales: the shares are decided by
	// the weights only once the starts far outnumber the 32 slots (a first claim
	// fills every slot at once, in an order the scheduler picks).
	per := max(s.n(10_000), 1_000)
	starts := per // the high queue's share of them (60 %) stays below its backlog
	weights := map[string]int{}
	total := 0
	for _, q := range priorityWeights {
		weights[q.name] = q.weight
		total += q.weight
	}
	r.Params["workers"], r.Params["slots_per_worker"], r.Params["weights"] = priorityWorkers, prioritySlots, "high 6, mid 3, low 1"
	r.Params["backlog_per_queue"], r.Params["starts_counted"] = per, starts

	var backlogs []queueBacklog
	for _, q := range priorityWeights {
		backlogs = append(backlogs, queueBacklog{queue: q.name, n: per})
	}
	if err := s.fillBacklogs(ctx, backlogs...); err != nil {
		return err
	}

	var (
		mu    sync.Mutex
		order []string // the queue of each start, in start order
	)
	handle := func(_ context.Context, t *delayq.Task) error {
		mu.Lock()
		order = append(order, t.Queue)
		mu.Unlock()
		return nil
	}
	elapsed, err := runPriorityWorkers(ctx, s, "the starts", func(w *delayq.Client) error {
		for _, q := range priorityWeights {
			if err := w.Handle(q.name, handle, delayq.QueueConfig{Concurrency: prioritySlots}); err != nil {
				return err
			}
		}
		return w.Prioritize(delayq.PriorityGroup{Queues: weights, Concurrency: prioritySlots})
	}, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) >= starts
	})
	if err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	count := map[string]int{}
	for _, q := range order[:starts] {
		count[q]++
	}
	r.Checks = map[string]int64{}
	var worst float64
	for _, q := range priorityWeights {
		want := float64(q.weight) / float64(total)
		got := float64(count[q.name]) / float64(starts)
		off := 100 * math.Abs(got-want) / want
		worst = max(worst, off)
		r.add("share_"+q.name, 100*got, fmt.Sprintf("%% of starts (weight %d: %.0f %%)", q.weight, 100*want))
		r.add("share_"+q.name+"_error", off, "% off its weight's share")
		r.Checks["starts_"+q.name] = int64(count[q.name])
	}
	r.add("starts_rate", float64(starts)/elapsed.Seconds(), "starts/s")
	if worst > 5 {
		return fmt.Errorf("a queue's share is %.1f %% off its weight's (more than 5 %%): %v", worst, count)
	}
	// At least 5,000 even at CI's scales: a level's boundary can be mixed by up to
	// a claim's worth of starts (32 run at once), which must stay well under 5 %
	// of the 1,000 starts of priority 9.
	return priorityWithin(ctx, s, r, max(s.n(10_000), 5_000))
}

// priorityWithinLevels are the priorities of the within-queue phase and the share
// of the backlog each has, by task number modulo 10: 2 in 10 at 9, 3 at 4, 5 at 0,
// interleaved, so that due order and priority order differ throughout.
var priorityWithinLevels = []struct{ priority, tenths int }{{9, 2}, {4, 3}, {0, 5}}

func withinPriority(j int) int {
	m := j % 10
	for _, l := range priorityWithinLevels {
		if m < l.tenths {
			return l.priority
		}
		m -= l.tenths
	}
	return 0
}

// priorityWithin: one queue, a backlog of n tasks due now with priorities 9, 4 and
// 0 mixed (withinPriority), drained by the same 2 workers of 16 slots. The claim
// order is strict, so the first starts are all of priority 9, then 4, then 0: for
// each level, the share of its own priority among the starts where it should run
// (the first 20 %, the next 30 %, the last 50 %), 100 % expected. Only a claim
// straddling two levels and handlers starting out of their claim's order (32 run at
// once) can mix them at a boundary.
func priorityWithin(ctx context.Context, s *session, r *Result, n int) error {
	const queue = "within"
	r.Params["within_backlog"], r.Params["within_priorities"] = n, "9: 20 %, 4: 30 %, 0: 50 %, interleaved in due order"
	if err := s.fillBacklogs(ctx, queueBacklog{queue: queue, n: n, priority: withinPriority}); err != nil {
		return err
	}
	var (
		mu    sync.Mutex
		order []int // the priority of each start, in start order
	)
	handle := func(_ context.Context, t *delayq.Task) error {
		var j int
		if _, err := fmt.Sscanf(t.ID, "task-%d", &j); err != nil {
			return err
		}
		mu.Lock()
		order = append(order, withinPriority(j))
		mu.Unlock()
		return nil
	}
	elapsed, err := runPriorityWorkers(ctx, s, "the within-queue starts", func(w *delayq.Client) error {
		return w.Handle(queue, handle, delayq.QueueConfig{Concurrency: prioritySlots})
	}, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) >= n
	})
	if err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	var worst float64
	from := 0
	for _, l := range priorityWithinLevels {
		to := from + n*l.tenths/10
		own := 0
		for _, p := range order[from:to] {
			if p == l.priority {
				own++
			}
		}
		share := 100 * float64(own) / float64(to-from)
		worst = max(worst, 100-share)
		r.add(fmt.Sprintf("within_share_p%d", l.priority), share,
			fmt.Sprintf("%% of starts %d..%d that were priority %d (strict: 100 %%)", from+1, to, l.priority))
		r.Checks[fmt.Sprintf("within_starts_p%d", l.priority)] = int64(own)
		from = to
	}
	r.add("within_starts_rate", float64(n)/elapsed.Seconds(), "starts/s")
	if worst > 5 {
		return fmt.Errorf("within one queue, a priority's share of its starts is %.1f %% below 100 %% (more than 5 %%)", worst)
	}
	return nil
}

// runPriorityWorkers runs priorityWorkers workers, each given its handlers by
// setup, until done says so (what names the wait in its timeout), and stops them;
// it returns how long they ran.
func runPriorityWorkers(ctx context.Context, s *session, what string, setup func(*delayq.Client) error, done func() bool) (time.Duration, error) {
	var stops []func() error
	for range priorityWorkers {
		w, err := clientkit.NewClient(s.pool, s.dq, s.ob, delayq.WorkerConfig{})
		if err == nil {
			err = setup(w)
		}
		if err != nil {
			return 0, stopAll(err, stops)
		}
		stops = append(stops, s.background(ctx, w.Run))
	}
	start := time.Now()
	err := waitFor(ctx, 10*time.Minute, what, func() (bool, error) { return done(), nil })
	elapsed := time.Since(start)
	return elapsed, stopAll(err, stops)
}
