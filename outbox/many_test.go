package outbox_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/outbox"
)

// TestEnqueueManyRunAt: EnqueueMany reports, for each inserted task, exactly the
// run_at stored (RunAt at the microsecond, the statement's time plus Delay), on
// both drivers, whatever order and duplicates the batch holds.
func TestEnqueueManyRunAt(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	db := b.sqlDB(t)
	zone := time.FixedZone("x", -(7*3600 + 1800))
	batch := func(q string) []outbox.Task {
		return []outbox.Task{
			{Queue: q, ID: "z-delay-ns", Delay: 90*time.Minute + 1234567*time.Nanosecond},
			{Queue: q, ID: "b-run-at-ns", RunAt: time.Date(2031, 3, 4, 5, 6, 7, 123456789, zone)},
			{Queue: q, ID: "a-now"},
			{Queue: q, ID: "b-run-at-ns", Delay: time.Hour}, // a repeat: duplicate
			{Queue: q, ID: "c-past", RunAt: time.Date(2001, 1, 1, 0, 0, 0, 999, time.UTC)},
			{Queue: q, ID: "d-centuries", Delay: 290 * 365 * 24 * time.Hour},
			{Queue: q, ID: "exists", Delay: time.Second},
			{Queue: q + "-other", ID: "a-now"}, // same id, other queue: a task of its own
		}
	}
	check := func(q string, tasks []outbox.Task, res outbox.ManyResult) {
		t.Helper()
		if res.Inserted != 6 || res.Duplicates != 2 {
			t.Fatalf("%s: inserted %d, duplicates %d; want 6, 2", q, res.Inserted, res.Duplicates)
		}
		for i, r := range res.Results {
			dup := i == 3 || tasks[i].ID == "exists"
			if r.Duplicate != dup {
				t.Fatalf("%s: Results[%d] = %+v, want duplicate %v", q, i, r, dup)
			}
			if dup {
				if !r.RunAt.IsZero() {
					t.Errorf("%s: duplicate %d has RunAt %v", q, i, r.RunAt)
				}
				continue
			}
			if s := load(t, b.pool, tasks[i].Queue, tasks[i].ID); !s.runAt.Equal(r.RunAt) {
				t.Errorf("%s: %s/%s: RunAt %v, stored %v", q, tasks[i].Queue, tasks[i].ID, r.RunAt, s.runAt)
			}
		}
		a, d := load(t, b.pool, q, "a-now"), load(t, b.pool, q, "z-delay-ns")
		if got := d.runAt.Sub(a.runAt); got != 90*time.Minute+1234*time.Microsecond {
			t.Errorf("%s: delay stored as %v after the statement's time", q, got)
		}
	}

	for _, q := range []string{"pgx", "sql"} {
		if _, err := b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: q, ID: "exists"}); err != nil {
			t.Fatal(err)
		}
	}
	tasks := batch("pgx")
	res, err := b.client.EnqueueMany(ctx, b.pool, tasks)
	if err != nil {
		t.Fatal(err)
	}
	check("pgx", tasks, res)

	tasks = batch("sql")
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err = b.client.EnqueueManySQL(ctx, tx, tasks)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	check("sql", tasks, res)
}

// TestEnqueueManyPlan: the rows reach the INSERT in the order of the arrays (which
// EnqueueMany sends sorted by key, so that overlapping batches cannot deadlock):
// between the unnest (ProjectSet) and the INSERT there is no node that could
// reorder them.
func TestEnqueueManyPlan(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	n := 1000
	q, ids, payloads := make([]string, n), make([]string, n), make([][]byte, n)
	runAts, delays, attempts := make([]*time.Time, n), make([]time.Duration, n), make([]int32, n)
	traces := make([]*string, n) // some with a trace context, as a batch may have
	prios := make([]int16, n)    // and some with a priority
	for i := range n {
		q[i], ids[i], payloads[i], delays[i], attempts[i] = "plan", fmt.Sprintf("t-%04d", i), []byte{}, time.Hour, 25
		if i%3 == 0 {
			tc := fmt.Sprintf("00-%032x-%016x-01", i+1, i+1)
			traces[i] = &tc
		}
		prios[i] = int16(i % 10)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var plan []byte
	err = tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+b.client.EnqueueManyStatement(),
		q, ids, runAts, delays, payloads, attempts, traces, make([]*time.Time, n), prios, []*string(nil)).Scan(&plan)
	if err != nil {
		t.Fatal(err)
	}
	type node struct {
		Type  string `json:"Node Type"`
		Plans []node `json:"Plans"`
	}
	var doc []struct{ Plan node }
	if err := json.Unmarshal(plan, &doc); err != nil {
		t.Fatal(err)
	}
	var find func(n node) *node
	find = func(n node) *node {
		if n.Type == "ModifyTable" {
			return &n
		}
		for _, c := range n.Plans {
			if m := find(c); m != nil {
				return m
			}
		}
		return nil
	}
	ins := find(doc[0].Plan)
	if ins == nil {
		t.Fatalf("no ModifyTable in the plan:\n%s", plan)
	}
	var walk func(n node) bool
	walk = func(n node) bool {
		switch n.Type {
		case "Subquery Scan", "Result", "ProjectSet":
		default:
			t.Errorf("%s under the INSERT: rows could be reordered; plan:\n%s", n.Type, plan)
			return false
		}
		for _, c := range n.Plans {
			if !walk(c) {
				return false
			}
		}
		return true
	}
	if len(ins.Plans) != 1 || !walk(ins.Plans[0]) {
		return
	}
	// And the order is the arrays' order: the rows land in heap order as sent.
	if _, err := tx.Exec(ctx, b.client.EnqueueManyStatement(), q, ids, runAts, delays, payloads, attempts, traces, make([]*time.Time, n), prios); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, `SELECT task_id FROM delayq_outbox WHERE queue = 'plan' ORDER BY ctid`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, ids) {
		t.Errorf("rows were inserted out of the arrays' order")
	}
}

// TestEnqueueManyNoDeadlock: batches with common keys, given in opposite and
// shuffled orders, committed concurrently, wait for each other and never
// deadlock; each key is inserted once.
func TestEnqueueManyNoDeadlock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	const producers, keys = 4, 2000
	for round := range 5 {
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			inserted int
			start    = make(chan struct{})
		)
		for p := range producers {
			tasks := make([]outbox.Task, keys)
			for i := range tasks {
				tasks[i] = outbox.Task{Queue: "dl", ID: fmt.Sprintf("r%d-%05d", round, i)}
			}
			switch p % 3 {
			case 1:
				slices.Reverse(tasks)
			case 2:
				rand.Shuffle(len(tasks), func(i, j int) { tasks[i], tasks[j] = tasks[j], tasks[i] })
			}
			wg.Go(func() {
				<-start
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					res, err := b.client.EnqueueMany(ctx, tx, tasks)
					if err != nil {
						return err
					}
					mu.Lock()
					inserted += res.Inserted
					mu.Unlock()
					return nil
				})
				if err != nil {
					t.Errorf("round %d, producer %d: %v", round, p, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if inserted != keys {
			t.Fatalf("round %d: %d inserted in all, want %d", round, inserted, keys)
		}
	}
}
