package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/workflow"
)

// startLog records when a handler first started each task id.
type startLog struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (s *startLog) note(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.at[id]; !ok {
		s.at[id] = time.Now()
	}
}

func (s *startLog) get(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.at[id]
	return t, ok
}

// workflowBench (issue 33, item 8): with one worker (32 slots, no-op
// transactional handlers) and one relay running throughout, two rounds of
// 10,000 plain tasks against a batch of 10,000 children with a callback, each
// enqueued in one transaction and timed until its last task ran; then 200
// batches of 10 children enqueued 10 ms apart, for the callback's lateness
// after its last child's finish; then a chain of 1,000, link after link.
func workflowBench(ctx context.Context, s *session, r *Result) error {
	n, small, links := s.n(10_000), s.n(200), s.n(1_000)
	r.Params["tasks"], r.Params["small_batches"], r.Params["chain"], r.Params["concurrency"] = n, small, links, 32
	w, err := clientkit.NewClient(s.pool, s.dq, s.ob, delayq.WorkerConfig{})
	if err != nil {
		return err
	}
	wf := workflow.New(s.ob)
	var plainCalls, childCalls atomic.Int64
	cbs, chain := &startLog{at: map[string]time.Time{}}, &startLog{at: map[string]time.Time{}}
	qc := delayq.QueueConfig{Concurrency: 32}
	for q, h := range map[string]func(context.Context, pgx.Tx, *delayq.Task) error{
		"wf-plain": func(context.Context, pgx.Tx, *delayq.Task) error { plainCalls.Add(1); return nil },
		"wf-child": func(context.Context, pgx.Tx, *delayq.Task) error { childCalls.Add(1); return nil },
		"wf-cb":    func(_ context.Context, _ pgx.Tx, t *delayq.Task) error { cbs.note(t.ID); return nil },
		"wf-chain": func(_ context.Context, _ pgx.Tx, t *delayq.Task) error { chain.note(t.ID); return nil },
	} {
		if err := w.HandleTx(q, h, qc); err != nil {
			return err
		}
	}
	stopRelay, err := s.startRelay(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = stopRelay() }()
	stopWorker := s.background(ctx, w.Run)
	defer func() { _ = stopWorker() }()

	tx := func(f func(tx pgx.Tx) error) error { return pgx.BeginFunc(ctx, s.pool, f) }
	tasks := func(queue, prefix string, k int) []outbox.Task {
		out := make([]outbox.Task, k)
		for i := range out {
			out[i] = outbox.Task{Queue: queue, ID: fmt.Sprintf("%s-%06d", prefix, i), Payload: payload20}
		}
		return out
	}
	var plainTimes, batchTimes, cbTimes []time.Duration
	var enqPlain, enqBatch []time.Duration
	for round := range 2 {
		// plain
		start := time.Now()
		if err := tx(func(tx pgx.Tx) error {
			_, err := s.ob.EnqueueMany(ctx, tx, tasks("wf-plain", fmt.Sprint("p", round), n))
			return err
		}); err != nil {
			return err
		}
		enqPlain = append(enqPlain, time.Since(start))
		want := int64((round + 1) * n)
		if err := waitFor(ctx, 10*time.Minute, "the plain tasks", func() (bool, error) { return plainCalls.Load() >= want, nil }); err != nil {
			return err
		}
		plainTimes = append(plainTimes, time.Since(start))
		s.env.Logger.Info("workflow bench: plain tasks ran", "round", round+1, "elapsed", time.Since(start))
		// batch
		cb := fmt.Sprint("big-", round)
		start = time.Now()
		if err := tx(func(tx pgx.Tx) error {
			_, err := wf.Batch(ctx, tx, outbox.Task{Queue: "wf-cb", ID: cb}, tasks("wf-child", fmt.Sprint("b", round), n))
			return err
		}); err != nil {
			return err
		}
		enqBatch = append(enqBatch, time.Since(start))
		if err := waitFor(ctx, 10*time.Minute, "the batch", func() (bool, error) { return childCalls.Load() >= want, nil }); err != nil {
			return err
		}
		batchTimes = append(batchTimes, time.Since(start))
		if err := waitFor(ctx, time.Minute, "the callback", func() (bool, error) { _, ok := cbs.get(cb); return ok, nil }); err != nil {
			return err
		}
		late, err := s.callbackLateness(ctx, cbs, []string{cb})
		if err != nil {
			return err
		}
		cbTimes = append(cbTimes, late...)
		s.env.Logger.Info("workflow bench: batch ran", "round", round+1, "elapsed", batchTimes[round])
	}
	mean := func(ds []time.Duration) time.Duration {
		var sum time.Duration
		for _, d := range ds {
			sum += d
		}
		return sum / time.Duration(len(ds))
	}
	for i := range plainTimes {
		r.add(fmt.Sprintf("round%d_plain_ms", i+1), ms(plainTimes[i]), "ms")
		r.add(fmt.Sprintf("round%d_batch_ms", i+1), ms(batchTimes[i]), "ms")
	}
	p, b := mean(plainTimes), mean(batchTimes)
	r.add("plain_us_per_task", float64(p.Microseconds())/float64(n), "µs")
	r.add("batch_us_per_child", float64(b.Microseconds())/float64(n), "µs")
	// a ratio (1.2: 20 % more time), never negative as the checks want figures
	r.add("batch_time_over_plain", float64(b)/float64(p), "x")
	r.add("enqueue_plain_us_per_task", float64(mean(enqPlain).Microseconds())/float64(n), "µs")
	r.add("enqueue_batch_us_per_child", float64(mean(enqBatch).Microseconds())/float64(n), "µs")
	r.add("big_callback_lateness_max_ms", ms(slices.Max(cbTimes)), "ms")

	// Small batches, 10 ms apart: the callback's lateness after the finish of
	// its last child.
	names := make([]string, small)
	for i := range small {
		names[i] = fmt.Sprint("small-", i)
		if err := tx(func(tx pgx.Tx) error {
			_, err := wf.Batch(ctx, tx, outbox.Task{Queue: "wf-cb", ID: names[i]}, tasks("wf-child", names[i], 10))
			return err
		}); err != nil {
			return err
		}
		time.Sleep(10 * time.Millisecond) // the offered load, not a wait for a result
	}
	if err := waitFor(ctx, 5*time.Minute, "the small batches' callbacks", func() (bool, error) {
		_, ok := cbs.get(names[small-1])
		for _, nm := range names {
			if _, ok2 := cbs.get(nm); !ok2 {
				return false, nil
			}
		}
		return ok, nil
	}); err != nil {
		return err
	}
	late, err := s.callbackLateness(ctx, cbs, names)
	if err != nil {
		return err
	}
	slices.Sort(late)
	s.env.Logger.Info("workflow bench: small batches ran")
	r.add("callback_lateness_p50_ms", ms(percentileD(late, 50)), "ms")
	r.add("callback_lateness_p99_ms", ms(percentileD(late, 99)), "ms")
	r.add("callback_lateness_max_ms", ms(late[len(late)-1]), "ms")

	// A chain of 1,000: each link runs after the one before finished.
	ids := make([]string, links)
	start := time.Now()
	if err := tx(func(tx pgx.Tx) error {
		for i := range links {
			ids[i] = fmt.Sprintf("link-%05d", i)
			t := outbox.Task{Queue: "wf-chain", ID: ids[i], Payload: payload20}
			var deps []workflow.Dependency
			if i > 0 {
				deps = []workflow.Dependency{workflow.On("wf-chain", ids[i-1])}
			}
			if _, err := wf.Enqueue(ctx, tx, t, deps...); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	enqChain := time.Since(start)
	if err := waitFor(ctx, 10*time.Minute, "the chain", func() (bool, error) { _, ok := chain.get(ids[links-1]); return ok, nil }); err != nil {
		return err
	}
	total := time.Since(start)
	steps, err := s.linkSteps(ctx, chain, ids)
	if err != nil {
		return err
	}
	slices.Sort(steps)
	r.add("chain_enqueue_ms", ms(enqChain), "ms")
	r.add("chain_total_ms", ms(total), "ms")
	r.add("chain_step_p50_ms", ms(percentileD(steps, 50)), "ms")
	r.add("chain_step_p99_ms", ms(percentileD(steps, 99)), "ms")

	var calls int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM delayq_batches b
LEFT JOIN LATERAL (SELECT sum(remaining) AS remaining, sum(done) AS done FROM delayq_batch_shards WHERE batch_id = b.id) s ON true
WHERE b.remaining + COALESCE(s.remaining, 0) <> 0 OR b.done + COALESCE(s.done, 0) <> b.total`).Scan(&calls); err != nil {
		return err
	}
	r.Checks = map[string]int64{"plain_calls": plainCalls.Load(), "child_calls": childCalls.Load(),
		"callbacks": int64(len(cbs.at)), "chain_links_run": int64(len(chain.at)), "batches_not_all_done": int64(calls)}
	if r.Checks["plain_calls"] != int64(2*n) || r.Checks["child_calls"] != int64(2*n+10*small) ||
		r.Checks["callbacks"] != int64(2+small) || r.Checks["chain_links_run"] != int64(links) || calls != 0 {
		return fmt.Errorf("checks %v", r.Checks)
	}
	return nil
}

// callbackLateness is, per callback named, its handler's start minus the
// statement time of its batch's last finish (finished_at): the last child's
// commit came after that, so the figure is an upper bound.
func (s *session) callbackLateness(ctx context.Context, cbs *startLog, names []string) ([]time.Duration, error) {
	rows, err := s.pool.Query(ctx, `SELECT task_id, finished_at FROM delayq_batches WHERE queue = 'wf-cb' AND task_id = ANY($1)`, names)
	if err != nil {
		return nil, err
	}
	var out []time.Duration
	var id string
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error {
		st, ok := cbs.get(id)
		if !ok {
			return fmt.Errorf("callback %s did not run", id)
		}
		out = append(out, st.Sub(at))
		return nil
	}); err != nil {
		return nil, err
	}
	if len(out) != len(names) {
		return nil, fmt.Errorf("%d batches finished of %d", len(out), len(names))
	}
	return out, nil
}

// linkSteps is, per link after the first, its handler's start minus the
// finish of the link before (done_at, the guard's statement time).
func (s *session) linkSteps(ctx context.Context, chain *startLog, ids []string) ([]time.Duration, error) {
	rows, err := s.pool.Query(ctx, `SELECT task_id, done_at FROM delayq_outbox WHERE queue = 'wf-chain'`)
	if err != nil {
		return nil, err
	}
	done := map[string]time.Time{}
	var id string
	var at *time.Time
	if _, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error {
		if at != nil {
			done[id] = *at
		}
		return nil
	}); err != nil {
		return nil, err
	}
	out := make([]time.Duration, 0, len(ids))
	for i := 1; i < len(ids); i++ {
		st, ok := chain.get(ids[i])
		if !ok {
			return nil, fmt.Errorf("link %s did not run", ids[i])
		}
		out = append(out, st.Sub(done[ids[i-1]]))
	}
	return out, nil
}
