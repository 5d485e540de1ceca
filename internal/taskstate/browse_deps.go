package taskstate

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// Dependencies and workflows on the dashboard and in 'delayq task show' (issue
// 33, item 7). delayq_deps holds one row per dependency still unfinished
// (the trigger delayq_outbox_release deletes an edge as it settles), so what
// these statements show is the part of a workflow still waiting: a task's
// dependencies that have not finished, and the dependents of a task that has
// not finished. Its primary key serves a task's dependents (queue, task_id
// first); delayq_deps_dependent_idx (migration 00023) a task's dependencies
// (dep_queue, dep_task_id), so every statement here, the walk's steps both
// ways included, reads an index.

// DepsStatements are the read-only statements of dependencies.
type DepsStatements struct {
	// Dependencies lists the dependencies queue/id still waits on, each with
	// its policy and its row's state ('' without a row): $1 queue, $2 task_id,
	// $3 limit, on delayq_deps_dependent_idx.
	Dependencies string
	// Dependents lists the dependents still waiting on queue/id, with their
	// policy and state, in key order, on delayq_deps_pkey: $1 queue, $2
	// task_id, $3 limit.
	Dependents string
	// CountDependents counts them, up to $3, on delayq_deps_pkey.
	CountDependents string
	// Connected lists the tasks connected to queue/id by the edges still
	// waiting, either way, queue/id first, at most $3: $1 queue, $2 task_id.
	Connected string
	// Edges lists the edges out of the keys given ($1 queues, $2 task ids,
	// pairwise), on delayq_deps_pkey.
	Edges string
	// BatchRow reads the counter of the batch whose callback is $1/$2
	// (Statements.BatchRow), on delayq_batches_callback_key.
	BatchRow string
}

// NewDeps builds the statements of dependencies for cfg.
func NewDeps(cfg Config) DepsStatements {
	table, deps := cfg.Table(), cfg.depsTable()
	return DepsStatements{
		Dependencies: fmt.Sprintf(`SELECT d.queue, d.task_id, d.on_failure, coalesce(o.state, '')
FROM %[1]s d LEFT JOIN %[2]s o ON o.queue = d.queue AND o.task_id = d.task_id
WHERE d.dep_queue = $1 AND d.dep_task_id = $2
ORDER BY d.queue, d.task_id
LIMIT $3`, deps, table),
		Dependents: fmt.Sprintf(`SELECT d.dep_queue, d.dep_task_id, d.on_failure, coalesce(o.state, '')
FROM %[1]s d LEFT JOIN %[2]s o ON o.queue = d.dep_queue AND o.task_id = d.dep_task_id
WHERE d.queue = $1 AND d.task_id = $2
ORDER BY d.dep_queue, d.dep_task_id
LIMIT $3`, deps, table),
		CountDependents: fmt.Sprintf(`SELECT count(*) FROM (SELECT FROM %s WHERE queue = $1 AND task_id = $2 LIMIT $3) AS x`, deps),
		// UNION (not ALL) keeps each task once, so the walk ends on any graph;
		// the outer LIMIT stops it once enough tasks are found.
		Connected: fmt.Sprintf(`WITH RECURSIVE w(queue, task_id) AS (
    SELECT $1::text, $2::text
  UNION
    SELECT e.queue, e.task_id FROM w, LATERAL (
        SELECT d.dep_queue, d.dep_task_id FROM %[1]s d WHERE d.queue = w.queue AND d.task_id = w.task_id
      UNION ALL
        SELECT d.queue, d.task_id FROM %[1]s d WHERE d.dep_queue = w.queue AND d.dep_task_id = w.task_id
    ) AS e(queue, task_id)
)
SELECT queue, task_id FROM w LIMIT $3`, deps),
		Edges: fmt.Sprintf(`SELECT d.queue, d.task_id, d.dep_queue, d.dep_task_id, d.on_failure
FROM %s d
WHERE (d.queue, d.task_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`, deps),
		BatchRow: batchRow(cfg),
	}
}

// Link is one edge seen from a task: the task at its other end, the edge's
// policy (fail, skip or run) and that task's state ("" when it has no row).
type Link struct {
	Queue, ID string
	Policy    string
	State     State
}

// Node is a task of a workflow with the edges still waiting from it.
type Node struct {
	BrowseRow
	// Found is false for a key without a row (purged).
	Found bool
	// WaitsOn are the dependencies it still waits on, among the workflow's
	// tasks found (Link.State is theirs), in key order.
	WaitsOn []Link
	waits   []string // their keys, for the order
}

// Workflow is the tasks connected to one by the edges still waiting, in
// dependency order (each after every task it waits on; ties in key order).
type Workflow struct {
	Nodes []Node
	// Truncated: the walk stopped at its bound; more tasks are connected.
	Truncated bool
}

// Deps runs the reads of dependencies. Like Store it holds no connection.
type Deps struct{ SQL DepsStatements }

// NewDepsReader returns a Deps for cfg.
func NewDepsReader(cfg Config) *Deps { return &Deps{SQL: NewDeps(cfg)} }

// Dependencies lists up to limit dependencies queue/id still waits on.
func (d *Deps) Dependencies(ctx context.Context, q Querier, queue, id string, limit int) ([]Link, error) {
	return d.links(ctx, q, d.SQL.Dependencies, "dependencies", queue, id, limit)
}

// Dependents lists up to limit dependents still waiting on queue/id, and how
// many there are, counted up to countCap.
func (d *Deps) Dependents(ctx context.Context, q Querier, queue, id string, limit, countCap int) ([]Link, int, error) {
	out, err := d.links(ctx, q, d.SQL.Dependents, "dependents", queue, id, limit)
	if err != nil {
		return nil, 0, err
	}
	n := len(out)
	if n == limit {
		if err := q.QueryRow(ctx, d.SQL.CountDependents, queue, id, countCap).Scan(&n); err != nil {
			return nil, 0, fmt.Errorf("%w: dependents of %s/%s: %w", ErrBrowse, queue, id, err)
		}
	}
	return out, n, nil
}

func (d *Deps) links(ctx context.Context, q Querier, sql, what, queue, id string, limit int) ([]Link, error) {
	rows, err := q.Query(ctx, sql, queue, id, limit)
	if err != nil {
		return nil, fmt.Errorf("%w: %s of %s/%s: %w", ErrBrowse, what, queue, id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Link, error) {
		var l Link
		var st string
		if err := r.Scan(&l.Queue, &l.ID, &l.Policy, &st); err != nil {
			return l, err
		}
		if st != "" {
			s, err := Parse(st)
			l.State = s
			return l, err
		}
		return l, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %s of %s/%s: %w", ErrBrowse, what, queue, id, err)
	}
	return out, nil
}

// Workflow walks the edges still waiting from queue/id, either way, to at most
// bound tasks, and returns them in dependency order with their rows (b reads
// them on the primary key).
func (d *Deps) Workflow(ctx context.Context, q Querier, b *Browse, queue, id string, bound int) (Workflow, error) {
	var w Workflow
	rows, err := q.Query(ctx, d.SQL.Connected, queue, id, bound+1)
	if err != nil {
		return w, fmt.Errorf("%w: workflow of %s/%s: %w", ErrBrowse, queue, id, err)
	}
	var qs, ids []string
	var kq, kid string
	_, err = pgx.ForEachRow(rows, []any{&kq, &kid}, func() error {
		qs, ids = append(qs, kq), append(ids, kid)
		return nil
	})
	if err != nil {
		return w, fmt.Errorf("%w: workflow of %s/%s: %w", ErrBrowse, queue, id, err)
	}
	if len(qs) > bound {
		qs, ids, w.Truncated = qs[:bound], ids[:bound], true
	}
	found, err := b.Rows(ctx, q, qs, ids)
	if err != nil {
		return w, err
	}
	key := func(q, id string) string { return q + "\x00" + id }
	nodes := make(map[string]*Node, len(qs))
	for i := range qs {
		nodes[key(qs[i], ids[i])] = &Node{BrowseRow: BrowseRow{Queue: qs[i], ID: ids[i]}}
	}
	for _, r := range found {
		if n := nodes[key(r.Queue, r.ID)]; n != nil {
			n.BrowseRow, n.Found = r, true
		}
	}
	rows, err = q.Query(ctx, d.SQL.Edges, qs, ids)
	if err != nil {
		return w, fmt.Errorf("%w: workflow of %s/%s: %w", ErrBrowse, queue, id, err)
	}
	var fq, fid, tq, tid, pol string
	_, err = pgx.ForEachRow(rows, []any{&fq, &fid, &tq, &tid, &pol}, func() error {
		if n, f := nodes[key(tq, tid)], nodes[key(fq, fid)]; n != nil && f != nil {
			n.waits = append(n.waits, key(fq, fid))
			n.WaitsOn = append(n.WaitsOn, Link{Queue: fq, ID: fid, Policy: pol, State: f.State})
		}
		return nil
	})
	if err != nil {
		return w, fmt.Errorf("%w: workflow of %s/%s: %w", ErrBrowse, queue, id, err)
	}
	for _, n := range nodes {
		slices.SortFunc(n.WaitsOn, func(a, b Link) int { return cmp.Or(cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.ID, b.ID)) })
	}
	w.Nodes = topoOrder(nodes)
	return w, nil
}

// topoOrder orders nodes so that each comes after every node it waits on
// (Kahn's algorithm; among the ready ones, key order). The edges cannot form a
// cycle (a dependency has a row before its dependent), but a node left over
// is appended rather than lost.
func topoOrder(nodes map[string]*Node) []Node {
	indeg := make(map[string]int, len(nodes))
	next := make(map[string][]string, len(nodes))
	for k, n := range nodes {
		indeg[k] += 0
		for _, dep := range n.waits {
			indeg[k]++
			next[dep] = append(next[dep], k)
		}
	}
	byKey := func(a, b string) int {
		na, nb := nodes[a], nodes[b]
		return cmp.Or(cmp.Compare(na.Queue, nb.Queue), cmp.Compare(na.ID, nb.ID))
	}
	var ready []string
	for k, d := range indeg {
		if d == 0 {
			ready = append(ready, k)
		}
	}
	out := make([]Node, 0, len(nodes))
	seen := make(map[string]bool, len(nodes))
	for len(ready) > 0 {
		slices.SortFunc(ready, byKey)
		k := ready[0]
		ready = ready[1:]
		seen[k] = true
		out = append(out, *nodes[k])
		for _, m := range next[k] {
			if indeg[m]--; indeg[m] == 0 {
				ready = append(ready, m)
			}
		}
	}
	var rest []string
	for k := range nodes {
		if !seen[k] {
			rest = append(rest, k)
		}
	}
	slices.SortFunc(rest, byKey)
	for _, k := range rest {
		out = append(out, *nodes[k])
	}
	return out
}
