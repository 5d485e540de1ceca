package taskstate

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
)

// The dependents of a task, their count and the edges of a workflow's tasks
// are read on delayq_deps_pkey, a task's dependencies on
// delayq_deps_dependent_idx, and the walk on both (20,000 edges: a fan-out of
// 10,000 and 5,000 pairs).
func TestDepsQueriesUseIndexes(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, `INSERT INTO delayq_deps (queue, task_id, dep_queue, dep_task_id, on_failure, channel)
SELECT CASE WHEN i <= 10000 THEN 'root' ELSE 'q' END, CASE WHEN i <= 10000 THEN 'r' ELSE 'a' || i END,
       'd', 'b' || i, 'fail', 'delayq_outbox'
FROM generate_series(1, 20000) AS i`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE delayq_deps`); err != nil {
		t.Fatal(err)
	}
	d := NewDeps(Config{Schema: "public", NotifyChannel: "delayq_outbox"})
	for _, tc := range []struct {
		name, sql string
		args      []any
		indexes   []string
	}{
		{"dependents", d.Dependents, []any{"q", "a15000", 100}, []string{"delayq_deps_pkey"}},
		{"dependents of a fan-out", d.Dependents, []any{"root", "r", 100}, []string{"delayq_deps_pkey"}},
		{"count", d.CountDependents, []any{"root", "r", 10001}, []string{"delayq_deps_pkey"}},
		{"edges", d.Edges, []any{[]string{"q", "q"}, []string{"a12000", "a13000"}}, []string{"delayq_deps_pkey"}},
		{"dependencies", d.Dependencies, []any{"d", "b15000", 100}, []string{"delayq_deps_dependent_idx"}},
		{"the walk", d.Connected, []any{"d", "b15000", 500}, []string{"delayq_deps_pkey", "delayq_deps_dependent_idx"}},
	} {
		p := explain(t, ctx, pool, tc.sql, tc.args...)
		for _, index := range tc.indexes {
			if !strings.Contains(p, index) {
				t.Errorf("%s: plan does not use %s:\n%s", tc.name, index, p)
			}
		}
		if strings.Contains(p, "Seq Scan on delayq_deps") {
			t.Errorf("%s: plan reads delayq_deps whole:\n%s", tc.name, p)
		}
	}
}

// Workflow walks the edges either way from any of its tasks, orders the tasks
// by dependency, stops at its bound, and a task's links name the other ends.
func TestDepsWorkflow(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// a -> b -> d, a -> c -> d (a diamond), e alone; z0 purged (an edge, no row).
	_, err := pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, waits_for)
VALUES ('w', 'a', now(), '', 1, 'pending', NULL), ('w', 'b', now(), '', 1, 'waiting', 1),
       ('w', 'c', now(), '', 1, 'waiting', 1), ('w', 'd', now(), '', 1, 'waiting', 3),
       ('w', 'e', now(), '', 1, 'pending', NULL)`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO delayq_deps (queue, task_id, dep_queue, dep_task_id, on_failure, channel)
VALUES ('w', 'a', 'w', 'b', 'fail', 'c'), ('w', 'a', 'w', 'c', 'skip', 'c'),
       ('w', 'c', 'w', 'd', 'run', 'c'), ('w', 'b', 'w', 'd', 'fail', 'c'), ('w', 'z0', 'w', 'd', 'fail', 'c')`)
	if err != nil {
		t.Fatal(err)
	}
	d, b := NewDepsReader(Config{Schema: "public"}), NewBrowser(Config{Schema: "public"})
	order := func(w Workflow) string {
		var s []string
		for _, n := range w.Nodes {
			s = append(s, fmt.Sprintf("%s:%s:%v", n.ID, n.State, n.Found))
		}
		return strings.Join(s, " ")
	}
	for _, from := range []string{"a", "b", "d"} {
		w, err := d.Workflow(ctx, pool, b, "w", from, 500)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := order(w), "a:pending:true b:waiting:true c:waiting:true z0::false d:waiting:true"; got != want || w.Truncated {
			t.Errorf("from %s: %s (truncated %v), want %s", from, got, w.Truncated, want)
		}
		last := w.Nodes[len(w.Nodes)-1]
		if len(last.WaitsOn) != 3 || last.WaitsOn[0].ID != "b" || last.WaitsOn[1].Policy != "run" || last.WaitsOn[2].State != "" {
			t.Errorf("from %s: d waits on %+v", from, last.WaitsOn)
		}
	}
	if w, err := d.Workflow(ctx, pool, b, "w", "a", 3); err != nil || len(w.Nodes) != 3 || !w.Truncated {
		t.Errorf("bounded to 3: %d tasks, truncated %v, %v", len(w.Nodes), w.Truncated, err)
	}
	if w, err := d.Workflow(ctx, pool, b, "w", "e", 500); err != nil || order(w) != "e:pending:true" {
		t.Errorf("alone: %s, %v", order(w), err)
	}
	deps, err := d.Dependencies(ctx, pool, "w", "d", 2)
	if err != nil || len(deps) != 2 || deps[0].ID != "b" || deps[0].State != Waiting || deps[1].Policy != "run" {
		t.Errorf("dependencies of d: %+v, %v", deps, err)
	}
	deps, n, err := d.Dependents(ctx, pool, "w", "a", 1, 100)
	if err != nil || n != 2 || len(deps) != 1 || deps[0].ID != "b" || deps[0].Policy != "fail" {
		t.Errorf("dependents of a: %+v (%d), %v", deps, n, err)
	}
}
