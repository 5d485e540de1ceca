package faults

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/testenv"
)

// The missed-deadline hook's table: one row per hand-over, written in the
// transaction that records the death. No unique constraint: a second hand-over of
// one task would be a second row.
const (
	sqlMissedTable = `CREATE TABLE IF NOT EXISTS fault_missed (
		queue text NOT NULL, task_id text NOT NULL, version int NOT NULL, worker text NOT NULL)`
	sqlInsertMissed = `INSERT INTO fault_missed (queue, task_id, version, worker) VALUES ($1, $2, $3, $4)`
)

// Start deadlines through an outage: about half of the tasks must start within 1
// to 4 seconds of their due time (outbox.Task.StartBy). Every worker stops while
// the load runs, for longer than most of those windows, and new workers start on
// the backlog. Each task with a deadline either ran exactly once, claimed by its
// deadline, or was handed to the queue's missed-deadline hook exactly once and
// never ran — never both, never late; the tasks without one all run. The workers'
// counts and their Prometheus counter of missed deadlines equal the misses.
func TestStartDeadline(t *testing.T) {
	t.Parallel()
	s := newSystem(t, "start-deadline", testenv.PostgresURL(t), testenv.OwnRedis(t).URL())
	ctx := s.ctx()
	if _, err := s.admin.Exec(ctx, sqlMissedTable); err != nil {
		t.Fatalf("missed table: %v", err)
	}
	s.runRelay("relay")
	fleet := &deadlineFleet{s: s, reg: prometheus.NewRegistry()}
	a, b := fleet.start("worker-a"), fleet.start("worker-b")
	l := s.newLoad(loadTasks, loadTime)
	l.deadline = 4 * time.Second
	done := l.start(ctx)

	s.waitEffects(ctx, 50)
	// The outage: both workers stop (their runs finish, their leases are handed
	// back), the load goes on, and tasks fall due with nobody to claim them.
	pause(ctx, between(500*time.Millisecond, 1500*time.Millisecond))
	a()
	b()
	pause(ctx, between(3*time.Second, 4*time.Second))
	fleet.start("worker-c")
	fleet.start("worker-d")
	wait(ctx, done)
	res := s.check(ctx, l, checkOpts{faults: 1})

	// Each task dead for its deadline went through the hook once, in its death's
	// transaction; no other task did.
	rows, err := s.admin.Query(ctx, `SELECT queue, task_id, count(*) FROM fault_missed GROUP BY queue, task_id`)
	if err != nil {
		t.Fatal(err)
	}
	handed := map[key]int{}
	var (
		k key
		n int
	)
	if _, err := pgx.ForEachRow(rows, []any{&k.queue, &k.id, &n}, func() error { handed[k] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	var dead []key
	rows, err = s.admin.Query(ctx, `SELECT queue, task_id FROM delayq_outbox WHERE state = 'dead' AND last_error LIKE 'missed its start deadline%'`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&k.queue, &k.id}, func() error { dead = append(dead, k); return nil }); err != nil {
		t.Fatal(err)
	}
	for _, k := range dead {
		if handed[k] != 1 {
			t.Errorf("%s: dead for its start deadline, handed to the hook %d times", k, handed[k])
		}
		delete(handed, k)
	}
	for k, n := range handed {
		t.Errorf("%s: handed to the missed-deadline hook %d times, but not dead for its deadline", k, n)
	}
	if len(dead) != res.missed {
		t.Errorf("%d rows dead for their deadline, the checker counted %d misses", len(dead), res.missed)
	}

	// The outage bit both ways: some tasks missed their deadline, others with one
	// ran in time (committed, not cancelled, not missed).
	ranInTime := -res.missed
	l.mu.Lock()
	for k := range l.startBy {
		if l.committed[k] && !l.cancelled[k] {
			ranInTime++
		}
	}
	l.mu.Unlock()
	if res.missed == 0 || ranInTime <= 0 {
		t.Errorf("of %d tasks with a start deadline, %d missed it and %d ran in time: want some of each", len(l.startBy), res.missed, ranInTime)
	}

	// What the workers report: Stats and delayq_worker_tasks_total{outcome="missed_deadline"}.
	stats, metric := fleet.missed(t)
	if stats != int64(res.missed) || metric != float64(res.missed) {
		t.Errorf("workers counted %d missed deadlines (Stats), %v (metric); the outbox has %d", stats, metric, res.missed)
	}
	t.Logf("start deadlines: %d tasks with one, %d missed (hook once each), %d ran in time; workers' count %d, metric %v",
		len(l.startBy), res.missed, ranInTime, stats, metric)
}

// deadlineFleet runs the scenario's workers in this process, each stoppable on its
// own, with the missed-deadline hook and one Prometheus registry.
type deadlineFleet struct {
	s   *system
	reg *prometheus.Registry

	mu      sync.Mutex
	workers []*delayq.Client
}

// start runs a worker until the returned stop is called or the test ends.
func (f *deadlineFleet) start(name string) (stop func()) {
	s, t := f.s, f.s.t
	pool := testenv.Pool(t, withParam(t, s.pgURL, "pool_max_conns", fmt.Sprint(workerConc*len(s.queues)+2)))
	cfg := workerConfig(s.logger(name))
	cfg.Registerer = f.reg
	w, err := clientkit.NewClient(pool, s.delayqClient(t, s.redisURL), s.ob, cfg)
	if err != nil {
		t.Fatal(err)
	}
	qc := queueConfig(s.groupCommit)
	qc.OnMissedDeadline = func(ctx context.Context, tx pgx.Tx, task *delayq.Task, cause error) error {
		if !errors.Is(cause, delayq.ErrMissedDeadline) {
			return fmt.Errorf("faults: missed-deadline hook called with %v", cause)
		}
		_, err := tx.Exec(ctx, sqlInsertMissed, task.Queue, task.ID, task.Version, name)
		return err
	}
	for _, q := range s.queues {
		if err := w.HandleTx(q, effectHandler(name), qc); err != nil {
			t.Fatal(err)
		}
	}
	f.mu.Lock()
	f.workers = append(f.workers, w)
	f.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := w.Run(ctx); err != nil {
			t.Errorf("%s: Run: %v", name, err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// missed sums the workers' Stats().MissedDeadline and the registry's
// delayq_worker_tasks_total{outcome="missed_deadline"}.
func (f *deadlineFleet) missed(t *testing.T) (int64, float64) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	var stats int64
	for _, w := range f.workers {
		stats += w.RunStats().MissedDeadline
	}
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var metric float64
	for _, mf := range mfs {
		if mf.GetName() != "delayq_worker_tasks_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "outcome" && lp.GetValue() == "missed_deadline" {
					metric += m.GetCounter().GetValue()
				}
			}
		}
	}
	return stats, metric
}
