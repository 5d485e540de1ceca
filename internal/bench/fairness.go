package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
)

// The fairness workload's shape (issue 34 item 6): 100 keys, one with a backlog
// 1000 times each other key's, a cap of 4 runs per key, fairSlots slots running
// each task fairRun.
const (
	fairKeys  = 100
	fairCap   = 4
	fairSlots = 32
	fairRun   = 2 * time.Millisecond
)

// fairness: claims straight on the dispatch client (no Postgres: the figures are
// the claim script's), a simulated pool of 32 slots, each run 2 ms.
//
//   - share: key k00 has 1000·m due tasks, k01..k99 m each, all due now (m = 20 at
//     scale 1). Over the starts while every small key still has due work, each
//     key's share of the starts against the fair share 1/100.
//   - lateness: k00 keeps a backlog while each small key gets a task due every
//     100 ms for 3 s; the lateness (claim time - due time) of those tasks.
//   - claim cost: rounds alternating a queue without keys and one with 100 keys
//     capped at 4 (tasks spread evenly), 20,000 tasks each (at scale 1), claims of 100 timed
//     (the completes between them not): µs per claimed task.
//   - memory: MEMORY USAGE of the key state (k:…) with 2 tasks in each of 100 keys.
func fairness(ctx context.Context, s *session, r *Result) error {
	m := max(s.n(20), 4)
	r.Params["keys"], r.Params["cap_per_key"], r.Params["slots"], r.Params["run"] = fairKeys, fairCap, fairSlots, fairRun.String()
	r.Params["small_backlog"], r.Params["big_backlog"] = m, 1000*m
	if err := fairShare(ctx, s, r, m); err != nil {
		return err
	}
	if err := fairLateness(ctx, s, r, m); err != nil {
		return err
	}
	if err := fairClaimCost(ctx, s, r); err != nil {
		return err
	}
	return fairMemory(ctx, s, r)
}

func fairKey(k int) string { return fmt.Sprintf("k%02d", k) }

// fairQueue sets the cap on queue (which turns fair dispatch on).
func fairQueue(ctx context.Context, s *session, queue string, cap int) error {
	_, err := s.dq.SetControls(ctx, queue, 1, dispatch.Controls{KeyConcurrency: cap})
	return err
}

func fairEnqueue(ctx context.Context, s *session, queue string, tasks []dispatch.Task) error {
	for i := 0; i < len(tasks); i += 5000 {
		if _, err := s.dq.Enqueue(ctx, queue, tasks[i:min(i+5000, len(tasks))]...); err != nil {
			return err
		}
	}
	return nil
}

// fairStart is one claimed task: its key, its due time and the claim's time.
type fairStart struct {
	key      string
	due, now time.Time
}

// fairPool claims from queue into fairSlots slots, each run taking fairRun then
// completing, and reports every start until stop returns true or ctx ends.
func fairPool(ctx context.Context, s *session, queue string, stop func([]fairStart) bool) ([]fairStart, error) {
	var (
		mu     sync.Mutex
		starts []fairStart
		wg     sync.WaitGroup
		errs   = make(chan error, fairSlots)
	)
	free := make(chan struct{}, fairSlots)
	for range fairSlots {
		free <- struct{}{}
	}
	defer wg.Wait()
	for {
		mu.Lock()
		done := stop(starts)
		mu.Unlock()
		if done {
			return starts, nil
		}
		select {
		case err := <-errs:
			return nil, err
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-free:
		}
		n := 1
		for len(free) > 0 && n < fairSlots {
			<-free
			n++
		}
		cl, err := s.dq.Claim(ctx, queue, n, time.Minute)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		for _, t := range cl.Tasks {
			starts = append(starts, fairStart{key: t.ID[:3], due: t.Due, now: cl.Now})
		}
		mu.Unlock()
		for range n - len(cl.Tasks) {
			free <- struct{}{}
		}
		if len(cl.Tasks) < n {
			// Nothing more due now: wait for a slot or the next due time.
			wait := 5 * time.Millisecond
			if cl.NextDue >= 0 && cl.NextDue < wait {
				wait = cl.NextDue
			}
			select {
			case <-time.After(wait):
			case <-ctx.Done():
			}
		}
		for _, t := range cl.Tasks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(fairRun) // the run
				if err := s.dq.Complete(ctx, queue, t.ID, t.Token); err != nil {
					errs <- err
				}
				free <- struct{}{}
			}()
		}
	}
}

func fairShare(ctx context.Context, s *session, r *Result, m int) error {
	const queue = "fair-share"
	if err := fairQueue(ctx, s, queue, fairCap); err != nil {
		return err
	}
	var tasks []dispatch.Task
	for i := range 1000 * m {
		tasks = append(tasks, dispatch.Task{ID: fmt.Sprintf("%s-%d", fairKey(0), i), RunAt: time.Now(), Payload: payload20, Key: fairKey(0)})
	}
	for k := 1; k < fairKeys; k++ {
		for i := range m {
			tasks = append(tasks, dispatch.Task{ID: fmt.Sprintf("%s-%d", fairKey(k), i), RunAt: time.Now(), Payload: payload20, Key: fairKey(k)})
		}
	}
	if err := fairEnqueue(ctx, s, queue, tasks); err != nil {
		return err
	}
	// Until the first small key has started all its tasks: every key had due work.
	starts, err := fairPool(ctx, s, queue, func(st []fairStart) bool {
		per := map[string]int{}
		for _, x := range st {
			if per[x.key]++; x.key != fairKey(0) && per[x.key] == m {
				return true
			}
		}
		return false
	})
	if err != nil {
		return err
	}
	per := map[string]int{}
	for _, x := range starts {
		per[x.key]++
	}
	fair := float64(len(starts)) / fairKeys
	lo, hi := 1e9, 0.0
	for k := 1; k < fairKeys; k++ {
		share := float64(per[fairKey(k)]) / fair
		lo, hi = min(lo, share), max(hi, share)
	}
	r.add("share_starts_counted", float64(len(starts)), "starts")
	r.add("share_big_key", float64(per[fairKey(0)])/fair, "x fair share")
	r.add("share_small_keys_min", lo, "x fair share")
	r.add("share_small_keys_max", hi, "x fair share")
	if lo < 0.5 || hi > 2 {
		return fmt.Errorf("small keys' shares %.2f..%.2f of the fair share: not within 2x", lo, hi)
	}
	return nil
}

func fairLateness(ctx context.Context, s *session, r *Result, m int) error {
	const queue = "fair-late"
	if err := fairQueue(ctx, s, queue, fairCap); err != nil {
		return err
	}
	const every, span = 100 * time.Millisecond, 3 * time.Second
	// The big key's backlog outlasts the span: 4 slots of 2 ms runs take ~2,000/s.
	big := max(1000*m, int(span.Seconds()*float64(fairCap)*float64(time.Second/fairRun)))
	var tasks []dispatch.Task
	for i := range big {
		tasks = append(tasks, dispatch.Task{ID: fmt.Sprintf("%s-%d", fairKey(0), i), RunAt: time.Now(), Payload: payload20, Key: fairKey(0)})
	}
	if err := fairEnqueue(ctx, s, queue, tasks); err != nil {
		return err
	}
	// The small keys' tasks fall due from a second on: after they are all
	// enqueued and the pool runs (else the enqueue's time counts as lateness).
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return err
	}
	now = now.Add(time.Second)
	tasks = tasks[:0]
	n := int(span / every)
	for k := 1; k < fairKeys; k++ {
		for i := range n {
			// Spread within the tick so that the keys do not all fall due at once.
			due := now.Add(time.Duration(i)*every + time.Duration(k)*every/fairKeys)
			tasks = append(tasks, dispatch.Task{ID: fmt.Sprintf("%s-%d", fairKey(k), i), RunAt: due, Payload: payload20, Key: fairKey(k)})
		}
	}
	if err := fairEnqueue(ctx, s, queue, tasks); err != nil {
		return err
	}
	small := (fairKeys - 1) * n
	starts, err := fairPool(ctx, s, queue, func(st []fairStart) bool {
		c := 0
		for _, x := range st {
			if x.key != fairKey(0) {
				c++
			}
		}
		return c == small
	})
	if err != nil {
		return err
	}
	var late []time.Duration
	bigStarts := 0
	for _, x := range starts {
		if x.key == fairKey(0) {
			bigStarts++
			continue
		}
		late = append(late, max(x.now.Sub(x.due), 0))
	}
	slices.Sort(late)
	r.add("late_small_p50", ms(percentileD(late, 50)), "ms")
	r.add("late_small_p99", ms(percentileD(late, 99)), "ms")
	r.add("late_small_max", ms(late[len(late)-1]), "ms")
	r.add("late_big_starts_meanwhile", float64(bigStarts), "starts")
	if bigStarts >= big {
		return fmt.Errorf("the big key drained (%d starts) before the small keys' tasks: nothing measured against it", bigStarts)
	}
	return nil
}

func fairClaimCost(ctx context.Context, s *session, r *Result) error {
	const rounds, batch = 3, 100
	per := max(s.n(20_000), 1_000)
	if err := fairQueue(ctx, s, "cost-keys", fairCap); err != nil {
		return err
	}
	run := func(round int, queue string, keyed bool) (time.Duration, int, error) {
		tasks := make([]dispatch.Task, per)
		now := time.Now()
		for i := range tasks {
			tasks[i] = dispatch.Task{ID: fmt.Sprintf("r%d-%d", round, i), RunAt: now, Payload: payload20}
			if keyed {
				tasks[i].Key = fairKey(i % fairKeys)
			}
		}
		if err := fairEnqueue(ctx, s, queue, tasks); err != nil {
			return 0, 0, err
		}
		var spent time.Duration
		claimed := 0
		for claimed < per {
			t0 := time.Now()
			cl, err := s.dq.Claim(ctx, queue, batch, time.Minute)
			spent += time.Since(t0)
			if err != nil {
				return 0, 0, err
			}
			if len(cl.Tasks) == 0 {
				return 0, 0, fmt.Errorf("%s: claimed %d of %d, then none", queue, claimed, per)
			}
			claimed += len(cl.Tasks)
			for _, t := range cl.Tasks {
				if err := s.dq.Complete(ctx, queue, t.ID, t.Token); err != nil {
					return 0, 0, err
				}
			}
		}
		return spent, claimed, nil
	}
	var plain, keyed []float64
	for round := range rounds {
		for _, q := range []struct {
			name  string
			keyed bool
			into  *[]float64
		}{{"cost-plain", false, &plain}, {"cost-keys", true, &keyed}} {
			spent, n, err := run(round, q.name, q.keyed)
			if err != nil {
				return err
			}
			*q.into = append(*q.into, float64(spent.Microseconds())/float64(n))
		}
	}
	slices.Sort(plain)
	slices.Sort(keyed)
	p, k := plain[len(plain)/2], keyed[len(keyed)/2]
	r.Params["cost_rounds"], r.Params["cost_tasks_per_round"], r.Params["cost_claim_batch"] = rounds, per, batch
	r.add("claim_cost_no_keys", p, "µs/claimed task (median round, round trip incl.)")
	r.add("claim_cost_keys_fair", k, "µs/claimed task (median round, round trip incl.)")
	r.add("claim_cost_keys_overhead", 100*(k-p)/p, "%")
	return nil
}

func fairMemory(ctx context.Context, s *session, r *Result) error {
	const queue = "fair-mem"
	if err := fairQueue(ctx, s, queue, fairCap); err != nil {
		return err
	}
	var tasks []dispatch.Task
	for k := range fairKeys {
		for i := range 2 {
			tasks = append(tasks, dispatch.Task{ID: fmt.Sprintf("%s-%d", fairKey(k), i), RunAt: time.Now(), Payload: payload20, Key: fairKey(k)})
		}
	}
	if err := fairEnqueue(ctx, s, queue, tasks); err != nil {
		return err
	}
	k, err := dispatch.KeysFor(s.prefix, queue)
	if err != nil {
		return err
	}
	keys, err := s.rdb.Keys(ctx, k.KeyPrefix+"*").Result()
	if err != nil {
		return err
	}
	var total int64
	for _, k := range keys {
		n, err := s.rdb.MemoryUsage(ctx, k).Result()
		if err != nil {
			return err
		}
		total += n
	}
	r.add("redis_bytes_per_key", float64(total)/fairKeys, "bytes (key state, one parked task a key)")
	return nil
}
