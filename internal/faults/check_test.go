package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/reconcile"
)

// checkOpts tune the checker to a scenario.
type checkOpts struct {
	// faults is the number of faults injected, for the summary.
	faults int
	// redisLost: Redis lost its data during the scenario. Postgres keeps dead
	// tasks, and reconcile does not put them back into Redis (they wait for a
	// person in the outbox), so a dead task may then be missing from Redis; it
	// must still never be live there.
	redisLost bool
	// skew is the Redis clock minus the local clock, exactly (0 when both are
	// the machine's), to read the handlers' local times on the Redis clock.
	skew time.Duration
	// maxLateness, when set, bounds how late a first run may be claimed.
	maxLateness time.Duration
	// settle bounds the wait for the system to finish every task. Default 60s.
	settle time.Duration
}

// outcome is what the checker found in one scenario.
type outcome struct {
	tasks, rolledBack, cancelled, dead, reruns        int
	lost, duplicated, early                           int
	rolledBackRun, cancelledRun, deadMismatch, incons int
	// missed counts the tasks dead for their start deadline, never run; late the
	// runs of a task with a deadline claimed after it (a violation).
	missed, late int
	maxLateness  time.Duration

	samples map[string][]string
}

func (o *outcome) note(category, format string, args ...any) {
	if len(o.samples[category]) < 5 {
		o.samples[category] = append(o.samples[category], fmt.Sprintf(format, args...))
	}
}

// row is an outbox row as the checker reads it.
type outboxRow struct {
	state, lastError string
	runAt            time.Time
	attempt          int
}

type effect struct {
	attempt                 int
	worker                  string
	due, claimedAt, localAt time.Time
}

// check waits for the system to settle, then asserts the invariants from
// Postgres, the effects table and Redis, prints the summary line and fails the
// test on any violation.
func (s *system) check(ctx context.Context, l *load, o checkOpts) outcome {
	t := s.t
	t.Helper()
	if o.settle == 0 {
		o.settle = 60 * time.Second
	}
	settled := s.settle(ctx, o.settle)

	res := outcome{samples: map[string][]string{}}
	rows, err := s.outboxRows(ctx)
	if err != nil {
		t.Fatalf("read the outbox: %v", err)
	}
	effects, err := s.effects(ctx)
	if err != nil {
		t.Fatalf("read the effects: %v", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()

	// Invariant 1: a committed enqueue is in the outbox and runs (unless cancelled);
	// a rolled-back one never exists nor runs.
	for k := range l.committed {
		if _, ok := rows[k]; !ok {
			res.lost++
			res.note("lost", "%s: committed, but no outbox row", k)
		}
	}
	for k := range l.rolledBack {
		if _, ok := rows[k]; ok {
			res.rolledBackRun++
			res.note("rolled_back_run", "%s: rolled back, but in the outbox", k)
		} else if n := len(effects[k]); n > 0 {
			res.rolledBackRun++
			res.note("rolled_back_run", "%s: rolled back, but %d effects", k, n)
		}
	}
	res.rolledBack = len(l.rolledBack)
	for k, es := range effects {
		if _, ok := rows[k]; !ok && !l.rolledBack[k] {
			res.rolledBackRun++
			res.note("rolled_back_run", "%s: %d effects of a task the outbox does not know", k, len(es))
		}
	}
	for k := range l.cancelled {
		if r, ok := rows[k]; ok && r.state != "cancelled" {
			res.cancelledRun++
			res.note("cancelled_run", "%s: cancelled, but state %s", k, r.state)
		}
	}

	// Invariant 2: exactly one effect per done task; none for any other.
	var deadKeys []key
	for k, r := range rows {
		res.tasks++
		n := len(effects[k])
		if n > 1 {
			res.duplicated += n - 1
			res.note("duplicated", "%s: %d effects (state %s): %s", k, n, r.state, describeEffects(effects[k]))
		}
		if r.state == "dead" {
			res.dead++
			deadKeys = append(deadKeys, k)
		}
		if l.failing[k] {
			if r.state != "dead" || n > 0 {
				res.deadMismatch++
				res.note("dead_mismatch", "%s: always fails, but state %s with %d effects", k, r.state, n)
			}
			continue
		}
		switch r.state {
		case "done":
			if n == 0 {
				res.lost++
				res.note("lost", "%s: done without an effect", k)
			}
		case "cancelled":
			res.cancelled++
			if n > 0 {
				res.cancelledRun++
				res.note("cancelled_run", "%s: cancelled, but %d effects", k, n)
			}
		case "dead":
			if _, ok := l.startBy[k]; ok && strings.Contains(r.lastError, "missed its start deadline") {
				if n == 0 {
					res.missed++
				} else { // both run and handed to the missed-deadline hook
					res.late++
					res.note("run_late", "%s: dead for its start deadline, but %d effects", k, n)
				}
				continue
			}
			res.lost++
			res.note("lost", "%s: dead after %d attempts (%s), but its handler never fails", k, r.attempt, r.lastError)
		default:
			res.lost++
			res.note("lost", "%s: still %s, %d effects", k, r.state, n)
		}
	}

	// Invariant 3: nothing starts before it is due, by the Redis clock: the claim
	// time against the due time Redis held and the run time the outbox holds (to
	// the millisecond, as Redis keeps it), and the handler's own clock read on the
	// Redis clock.
	var (
		lateness []time.Duration
		latest   string
	)
	for k, es := range effects {
		r, hasRow := rows[k]
		for _, e := range es {
			if e.attempt > 1 {
				res.reruns++
			}
			runAt := e.due
			if hasRow {
				runAt = time.UnixMilli(r.runAt.UnixMilli())
			}
			local := e.localAt.Add(o.skew)
			switch {
			case e.claimedAt.Before(e.due):
				res.early++
				res.note("early", "%s: claimed at %s, due %s", k, stamp(e.claimedAt), stamp(e.due))
			case e.claimedAt.Before(runAt):
				res.early++
				res.note("early", "%s: claimed at %s, outbox run_at %s", k, stamp(e.claimedAt), stamp(r.runAt))
			case local.Before(e.due.Add(-5 * time.Millisecond)):
				res.early++
				res.note("early", "%s: handler started at %s (local clock on the Redis clock), due %s", k, stamp(local), stamp(e.due))
			}
			// A task with a start deadline never runs after it (by the Redis clock,
			// to the millisecond Redis keeps it).
			if by, ok := l.startBy[k]; ok && e.claimedAt.After(by.Add(time.Millisecond)) {
				res.late++
				res.note("run_late", "%s: claimed at %s, start deadline %s", k, stamp(e.claimedAt), stamp(by))
			}
			if e.attempt == 1 {
				late := e.claimedAt.Sub(e.due)
				res.maxLateness = max(res.maxLateness, late)
				lateness = append(lateness, late)
				if late >= res.maxLateness {
					latest = fmt.Sprintf("%s due %s, claimed %s by %s", k, stamp(e.due), stamp(e.claimedAt), e.worker)
				}
			}
		}
	}

	// Dead in both stores: every dead row is dead in Redis, every dead task in
	// Redis is dead in Postgres.
	s.checkDead(ctx, rows, deadKeys, o.redisLost, &res)

	// Nothing left for reconcile to repair.
	incs, err := reconcile.Check(ctx, s.admin, s.dq, reconcile.Options{Queues: s.queues, Grace: -1})
	if err != nil {
		t.Errorf("reconcile.Check: %v", err)
	}
	for _, inc := range incs {
		res.incons++
		res.note("inconsistent", "%s %s/%s: postgres %q, redis %q", inc.Kind, inc.Queue, inc.ID, inc.Postgres, inc.Redis)
	}

	line := fmt.Sprintf("fault-suite: scenario=%s tasks=%d faults=%d lost=%d duplicated=%d early=%d "+
		"rolled_back=%d rolled_back_run=%d cancelled=%d cancelled_run=%d dead=%d dead_mismatch=%d "+
		"inconsistent=%d reruns=%d max_lateness=%s elapsed=%s",
		s.scenario, res.tasks, o.faults, res.lost, res.duplicated, res.early,
		res.rolledBack, res.rolledBackRun, res.cancelled, res.cancelledRun, res.dead, res.deadMismatch,
		res.incons, res.reruns, res.maxLateness.Round(time.Millisecond), time.Since(s.started).Round(100*time.Millisecond))
	if len(l.startBy) > 0 {
		line += fmt.Sprintf(" deadlines=%d missed_deadline=%d run_late=%d", len(l.startBy), res.missed, res.late)
	}
	t.Log(line)
	fmt.Println(line)
	if len(lateness) > 0 {
		slices.Sort(lateness)
		pct := func(p int) time.Duration { return lateness[(len(lateness)-1)*p/100].Round(time.Millisecond) }
		t.Logf("claim lateness of first runs: p50 %v, p90 %v, p99 %v, max %v (%s)", pct(50), pct(90), pct(99), pct(100), latest)
	}

	if bad := res.lost + res.duplicated + res.early + res.rolledBackRun + res.cancelledRun + res.deadMismatch + res.incons + res.late; bad > 0 || !settled {
		cats := make([]string, 0, len(res.samples))
		for c := range res.samples {
			cats = append(cats, c)
		}
		slices.Sort(cats)
		var b strings.Builder
		for _, c := range cats {
			fmt.Fprintf(&b, "\n  %s:\n    %s", c, strings.Join(res.samples[c], "\n    "))
		}
		t.Errorf("invariants violated (settled=%v):%s", settled, b.String())
	}
	if o.maxLateness > 0 && res.maxLateness > o.maxLateness {
		t.Errorf("a first run was claimed %v after it was due; want at most %v", res.maxLateness, o.maxLateness)
	}
	if res.tasks < l.n/3 {
		t.Errorf("only %d of %d tasks were committed: the load did not run (producer errors %d, last %v)", res.tasks, l.n, l.errs, l.lastErr)
	}
	return res
}

// settle waits until no row is pending or queued and Redis holds no ready or
// active task: every task finished and Redis agrees. False when d passed first.
func (s *system) settle(ctx context.Context, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	tk := time.NewTicker(100 * time.Millisecond)
	defer tk.Stop()
	var why string
	for {
		var open int
		err := s.admin.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE state IN ('pending', 'queued')`).Scan(&open)
		switch {
		case err != nil:
			why = err.Error()
		case open > 0:
			why = fmt.Sprintf("%d rows pending or queued", open)
		default:
			why = ""
			for _, q := range s.queues {
				st, err := s.dq.Stats(ctx, q)
				if err != nil {
					why = err.Error()
					break
				}
				if st.Ready+st.Active > 0 {
					why = fmt.Sprintf("queue %s: %d ready, %d active in Redis", q, st.Ready, st.Active)
					break
				}
			}
			if why == "" {
				return true
			}
		}
		select {
		case <-ctx.Done():
			s.t.Errorf("not settled within %v: %s", d, why)
			return false
		case <-tk.C:
		}
	}
}

func (s *system) outboxRows(ctx context.Context) (map[key]outboxRow, error) {
	rows, err := s.admin.Query(ctx, `SELECT queue, task_id, state, COALESCE(last_error, ''), run_at, attempt FROM delayq_outbox`)
	if err != nil {
		return nil, err
	}
	out := map[key]outboxRow{}
	var (
		k key
		r outboxRow
	)
	_, err = pgx.ForEachRow(rows, []any{&k.queue, &k.id, &r.state, &r.lastError, &r.runAt, &r.attempt}, func() error {
		out[k] = r
		return nil
	})
	return out, err
}

func (s *system) effects(ctx context.Context) (map[key][]effect, error) {
	rows, err := s.admin.Query(ctx, `SELECT queue, task_id, attempt, worker, due, claimed_at, local_at FROM fault_effects`)
	if err != nil {
		return nil, err
	}
	out := map[key][]effect{}
	var (
		k key
		e effect
	)
	_, err = pgx.ForEachRow(rows, []any{&k.queue, &k.id, &e.attempt, &e.worker, &e.due, &e.claimedAt, &e.localAt}, func() error {
		out[k] = append(out[k], e)
		return nil
	})
	return out, err
}

// checkDead compares the dead tasks of both stores.
func (s *system) checkDead(ctx context.Context, rows map[key]outboxRow, deadKeys []key, redisLost bool, res *outcome) {
	byQueue := map[string][]string{}
	for _, k := range deadKeys {
		byQueue[k.queue] = append(byQueue[k.queue], k.id)
	}
	for _, q := range s.queues {
		ids := byQueue[q]
		for len(ids) > 0 {
			part := ids[:min(len(ids), 500)]
			ids = ids[len(part):]
			infos, err := s.dq.Inspect(ctx, q, part...)
			if err != nil {
				s.t.Errorf("inspect dead tasks of %s: %v", q, err)
				break
			}
			for _, ti := range infos {
				if ti.State == dispatch.StateDead || redisLost && ti.State == dispatch.StateMissing {
					continue
				}
				res.deadMismatch++
				res.note("dead_mismatch", "%s/%s: dead in Postgres, %s in Redis", q, ti.ID, ti.State)
			}
		}
		keys, err := s.dq.Keys(q)
		if err != nil {
			s.t.Fatal(err)
		}
		members, err := s.rdb.ZRange(ctx, keys.Dead, 0, -1).Result()
		if err != nil {
			s.t.Errorf("read the dead set of %s: %v", q, err)
			continue
		}
		for _, id := range members {
			if r := rows[key{q, id}]; r.state != "dead" {
				res.deadMismatch++
				res.note("dead_mismatch", "%s/%s: dead in Redis, %q in Postgres", q, id, r.state)
			}
		}
	}
}

func describeEffects(es []effect) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = fmt.Sprintf("attempt %d by %s at %s", e.attempt, e.worker, stamp(e.claimedAt))
	}
	return strings.Join(parts, "; ")
}

func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000") }
