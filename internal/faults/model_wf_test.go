package faults

// The workflow part of the model test (issue 33): tasks enqueued waiting on
// others (package workflow) among the model's tasks, under the same faults
// (worker and relay SIGKILL, Redis loss, a Postgres crash, dead dependencies,
// cancels, dead retries and purges). A trigger of the test's own records every
// change of a row's state with its transaction, so the checker can tell, for
// each dependent, that it left waiting exactly once, in the transaction that
// finished its last dependency (or, failed or skipped, one that finished a
// dependency as its policy says), and that no run of it was claimed before.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/workflow"
)

// sqlModelTransitions records every change of a row's state (and every insert)
// with its transaction. Triggers of one event fire in name order:
// delayq_outbox_release runs before model_note on a dependency's row, so the
// dependents it settles are noted before the dependency's own change, in the
// same transaction.
const sqlModelTransitions = `
CREATE TABLE model_transitions (
	seq bigserial PRIMARY KEY, queue text NOT NULL, task_id text NOT NULL, old_state text, new_state text NOT NULL,
	version int NOT NULL, xid xid8 NOT NULL DEFAULT pg_current_xact_id(), at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION model_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO model_transitions (queue, task_id, old_state, new_state, version)
	VALUES (NEW.queue, NEW.task_id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END, NEW.state, NEW.version);
	RETURN NULL;
END $$;
CREATE TRIGGER model_note AFTER UPDATE OF state ON delayq_outbox FOR EACH ROW
	WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION model_note();
CREATE TRIGGER model_note_insert AFTER INSERT ON delayq_outbox FOR EACH ROW EXECUTE FUNCTION model_note();`

// mdep is a task the model enqueued through package workflow.
type mdep struct {
	q, id string
	deps  []workflow.Dependency
	// state is what the enqueue returned: waiting, pending, dead or cancelled.
	state delayqtype.State
	// version is the row's as the model last saw it: 1, bumped by dead
	// retries of the queue (a dependent failed by its policy is dead too).
	version int
	at      time.Time
	log     []string
	// cancelXids are the transactions of the chain cancels that cancelled it
	// (opChainCancel): it may leave waiting for cancelled in one of them.
	cancelXids []string
}

func (d *mdep) key() key { return key{d.q, d.id} }

// depTarget picks a dependency for a new dependent: a model task, an earlier
// dependent, or (nil) a new task to enqueue in the same transaction.
func (m *model) depTarget() *key {
	// Half new: most tasks of the model finish within a second or two, and a
	// dependent must often wait on more than one open task.
	switch n := m.rng.IntN(10); {
	case n < 3 && len(m.order) > 0:
		k := m.order[m.rng.IntN(len(m.order))].key()
		return &k
	case n < 5 && len(m.wfOrder) > 0:
		k := m.wfOrder[m.rng.IntN(len(m.wfOrder))].key()
		return &k
	}
	return nil
}

func (m *model) policy() workflow.Policy {
	return []workflow.Policy{workflow.Fail, workflow.Skip, workflow.Run}[m.rng.IntN(3)]
}

// opWorkflow commits a transaction that enqueues a task waiting on one to four
// others (model tasks in any state, earlier dependents, new tasks enqueued
// before it in the same transaction), each with a random policy; or, one time
// in four, a chain of two to four new tasks.
func (m *model) opWorkflow(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := m.s.admin.Begin(ctx)
	if err != nil {
		m.s.t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after the commit
	var news []*mtask
	var newTasks []outbox.Task
	var newRunAt []time.Time
	newTask := func() key {
		m.nextID++
		t := &mtask{q: m.queue(), id: fmt.Sprintf("d%04d", m.nextID)}
		d, _ := m.delay()
		ot := outbox.Task{Queue: t.q, ID: t.id, Payload: modelPayload(1), Delay: d, MaxAttempts: 2 + m.rng.IntN(4), Priority: modelPriority(t.id)}
		r, err := m.s.ob.Enqueue(ctx, tx, ot)
		if err != nil || r.Duplicate {
			m.s.t.Fatalf("enqueue %s: %v (%+v)", t.key(), err, r)
		}
		news, newTasks, newRunAt = append(news, t), append(newTasks, ot), append(newRunAt, r.RunAt)
		return t.key()
	}
	var added []*mdep
	dependent := func(deps []workflow.Dependency) (*mdep, error) {
		m.nextID++
		d := &mdep{q: m.queue(), id: fmt.Sprintf("w%04d", m.nextID), deps: deps, version: 1}
		delay, _ := m.delay()
		if m.rng.IntN(2) == 0 {
			delay = 0
		}
		r, err := m.wf.Enqueue(ctx, tx, outbox.Task{Queue: d.q, ID: d.id, Payload: modelPayload(1), Delay: delay,
			MaxAttempts: 2 + m.rng.IntN(4), Priority: modelPriority(d.id)}, deps...)
		if err != nil {
			return nil, err
		}
		if r.Duplicate {
			m.violation(nil, "workflow enqueue of the new %s reported a duplicate", d.key())
		}
		d.state = r.State
		added = append(added, d)
		return d, nil
	}
	var desc string
	var chain []key
	if m.rng.IntN(4) == 0 {
		// A chain: each link a dependent of the one before.
		p := m.policy()
		prev := newTask()
		chain = append(chain, prev)
		n := 1 + m.rng.IntN(3)
		for range n {
			d, err := dependent([]workflow.Dependency{{Queue: prev.queue, ID: prev.id, OnFailure: p}})
			if err != nil {
				m.s.t.Fatalf("chain: %v", err)
			}
			prev = d.key()
			chain = append(chain, prev)
		}
		desc = fmt.Sprintf("chain of %d after %s, policy %s", n, news[0].key(), p)
	} else {
		var deps []workflow.Dependency
		var unknownOK bool
		for range 1 + m.rng.IntN(4) {
			k := m.depTarget()
			if k == nil {
				nk := newTask()
				k = &nk
			} else if t := m.tasks[*k]; t != nil && (t.k == kGone || t.k == kMaybeGone) {
				unknownOK = true
			} else if m.wfTasks[*k] != nil && m.ops["prune"]+m.ops["dead-purge"]+m.ops["dead-purge-all"]+m.ops["reshard"] > 0 {
				unknownOK = true // a dependent may have been purged or pruned
			}
			deps = append(deps, workflow.Dependency{Queue: k.queue, ID: k.id, OnFailure: m.policy()})
		}
		d, err := dependent(deps)
		switch {
		case errors.Is(err, workflow.ErrUnknownDependency) && unknownOK:
			m.logf(nil, "workflow enqueue: %v", err)
			return // rolled back
		case err != nil:
			m.violation(nil, "workflow enqueue on %v: %v", deps, err)
			return
		}
		desc = fmt.Sprintf("%s on %v: %s", d.key(), deps, d.state)
	}
	if err := tx.Commit(ctx); err != nil {
		m.s.t.Fatalf("commit workflow: %v", err)
	}
	now := time.Now()
	for i, t := range news {
		m.tasks[t.key()] = t
		m.order = append(m.order, t)
		m.begin(t, newTasks[i].MaxAttempts, newRunAt[i])
		m.logf(t, "enqueue as a dependency (workflow op): run_at %s", stamp(newRunAt[i]))
	}
	for _, d := range added {
		d.at = now
		m.wfTasks[d.key()] = d
		m.wfOrder = append(m.wfOrder, d)
		d.log = append(d.log, fmt.Sprintf("%7.3fs enqueued %s on %v", time.Since(m.start).Seconds(), d.state, d.deps))
	}
	if chain != nil {
		m.chains = append(m.chains, chain)
	}
	m.logf(nil, "workflow: %s", desc)
}

// opChainCancel cancels a chain (workflow.Client.Cancel on one of its links):
// in one transaction, the links connected to it by edges still waiting. A
// dependent it cancels leaves waiting for cancelled in that transaction, which
// the checker accepts there alone; the first link, a model task, is known
// cancelled from then on. The other invariants hold as for any cancel: no run
// before leaving waiting, no effect of a cancelled task, the dependents of a
// cancelled link outside the chain settled as their policies say.
func (m *model) opChainCancel(ctx context.Context) {
	if len(m.chains) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The newest of the last five whose last link still waits (most chains run
	// to their end within a second or two), else one of the last three.
	links := m.chains[len(m.chains)-1-m.rng.IntN(min(3, len(m.chains)))]
	for i := len(m.chains) - 1; i >= max(0, len(m.chains)-5); i-- {
		last := m.chains[i][len(m.chains[i])-1]
		var st string
		err := m.s.admin.QueryRow(ctx, `SELECT state FROM delayq_outbox WHERE queue = $1 AND task_id = $2`, last.queue, last.id).Scan(&st)
		if err == nil && st == string(delayqtype.StateWaiting) {
			links = m.chains[i]
			break
		}
	}
	via := links[m.rng.IntN(len(links))]
	tx, err := m.s.admin.Begin(ctx)
	if err != nil {
		m.s.t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after the commit
	var xid string
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
		m.s.t.Fatalf("xid: %v", err)
	}
	n, err := m.wf.Cancel(ctx, tx, via.queue, via.id)
	switch {
	case errors.Is(err, outbox.ErrNotFound):
		m.logf(nil, "chain cancel via %s: not found (pruned or purged)", via)
		return
	case err != nil:
		m.s.t.Fatalf("chain cancel via %s: %v", via, err)
	}
	states := map[key]string{}
	rs, err := tx.Query(ctx, `SELECT queue, task_id, state FROM delayq_outbox WHERE (queue, task_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`,
		keyQueues(links), keyIDs(links))
	if err != nil {
		m.s.t.Fatalf("read the chain: %v", err)
	}
	var (
		k  key
		st string
	)
	if _, err := pgx.ForEachRow(rs, []any{&k.queue, &k.id, &st}, func() error { states[k] = st; return nil }); err != nil {
		m.s.t.Fatalf("read the chain: %v", err)
	}
	cutAt := time.Now() // before the commit, as reschedule's
	if err := tx.Commit(ctx); err != nil {
		m.s.t.Fatalf("commit chain cancel: %v", err)
	}
	for _, k := range links {
		st, ok := states[k]
		if !ok || st != string(delayqtype.StateCancelled) {
			continue
		}
		if t := m.tasks[k]; t != nil {
			switch t.k {
			case kOpen, kMaybeGone:
				t.k = kCancelled
				t.cuts = append(t.cuts, leaseCut{cutAt, t.inc, t.version + 1})
				m.logf(t, "chain cancel via %s: cancelled (version %d)", via, t.version)
			case kDone:
				m.violation(t, "chain cancel via %s: cancelled, but known done", via)
			}
			continue
		}
		if d := m.wfTasks[k]; d != nil {
			d.cancelXids = append(d.cancelXids, xid)
			d.log = append(d.log, fmt.Sprintf("%7.3fs chain cancel via %s in xid %s (%d cancelled)", time.Since(m.start).Seconds(), via, xid, n))
		}
	}
	m.ops["(chain-cancel tasks)"] += n
	m.logf(nil, "chain cancel via %s: %d cancelled", via, n)
}

// transition is one row of model_transitions.
type transitionRow struct {
	seq      int64
	old, new string
	version  int
	xid      string
	at       time.Time
}

// checkWorkflows checks every dependent against the recorded transitions.
func (m *model) checkWorkflows(ctx context.Context, v *violations, rows map[key]modelRow, runs map[key][]modelRun, effects map[key][]modelEffect) {
	trans := map[key][]transitionRow{}
	rs, err := m.s.admin.Query(ctx, `SELECT queue, task_id, seq, COALESCE(old_state, ''), new_state, version, xid::text, at FROM model_transitions ORDER BY seq`)
	if err != nil {
		m.s.t.Fatal(err)
	}
	var (
		k  key
		tr transitionRow
	)
	if _, err := pgx.ForEachRow(rs, []any{&k.queue, &k.id, &tr.seq, &tr.old, &tr.new, &tr.version, &tr.xid, &tr.at}, func() error {
		trans[k] = append(trans[k], tr)
		return nil
	}); err != nil {
		m.s.t.Fatal(err)
	}
	finished := func(s string) bool { return s == "done" || s == "dead" || s == "cancelled" }
	released, failed, chainCancelled := 0, 0, 0
	for _, d := range m.wfOrder {
		bad := func(format string, args ...any) {
			hist := "\n      history: " + strings.Join(d.log, "\n               ")
			for _, t := range trans[d.key()] {
				hist += fmt.Sprintf("\n      %d %s -> %s v%d xid %s at %s", t.seq, t.old, t.new, t.version, t.xid, stamp(t.at))
			}
			v.add("workflow", "%s: %s%s", d.key(), fmt.Sprintf(format, args...), hist)
		}
		ts := trans[d.key()]
		if len(ts) == 0 || ts[0].old != "" || ts[0].new != string(d.state) {
			bad("first recorded state is not the enqueue's %s", d.state)
			continue
		}
		var outs []transitionRow
		for _, t := range ts {
			if t.old == string(delayqtype.StateWaiting) {
				outs = append(outs, t)
			}
		}
		if row, ok := rows[d.key()]; ok && row.state == string(delayqtype.StateWaiting) {
			bad("still waiting after the system settled")
			continue
		}
		if d.state != delayqtype.StateWaiting {
			if len(outs) != 0 {
				bad("left waiting %d times, but was never waiting", len(outs))
			}
			continue
		}
		if len(outs) != 1 {
			bad("left waiting %d times, want exactly once", len(outs))
			continue
		}
		out := outs[0]
		// Each dependency's first finish after the dependent was enqueued (its
		// finish before then would have been counted at the enqueue).
		type fin struct {
			t      transitionRow
			policy workflow.Policy
			key    key
		}
		var fins []fin
		for _, dep := range d.deps {
			dk := key{dep.Queue, dep.ID}
			// Its state when the dependent was enqueued: finished then, it
			// was counted at once (whatever a dead retry did later).
			var f *transitionRow
			before := ""
			for _, t := range trans[dk] {
				if t.seq < ts[0].seq {
					before = t.new
					continue
				}
				if finished(before) {
					break
				}
				if finished(t.new) && !finished(t.old) {
					f = &t
					break
				}
			}
			if f == nil {
				// Finished before the enqueue (counted at once) or never.
				continue
			}
			fins = append(fins, fin{*f, dep.OnFailure, dk})
		}
		inOut := false
		for _, f := range fins {
			switch {
			case f.t.xid == out.xid:
				inOut = true
			case f.t.seq > out.seq:
				// Finished after the dependent left waiting, in another transaction:
				// fine if the dependent failed or was skipped (or cancelled) before.
				if out.new == string(delayqtype.StatePending) {
					bad("released (seq %d) before %s finished (seq %d)", out.seq, f.key, f.t.seq)
				}
			}
		}
		switch {
		case out.new == string(delayqtype.StateCancelled) && slices.Contains(d.cancelXids, out.xid):
			chainCancelled++ // by a chain cancel, in its transaction
		case out.new == string(delayqtype.StatePending):
			released++
			if !inOut {
				bad("released in transaction %s, which finished none of its dependencies", out.xid)
			}
			for _, f := range fins {
				if f.t.new != "done" && f.policy != workflow.Run {
					bad("released although %s ended %s with policy %s", f.key, f.t.new, f.policy)
				}
			}
		case out.new == string(delayqtype.StateDead) || out.new == string(delayqtype.StateCancelled):
			failed++
			want := workflow.Fail
			if out.new == string(delayqtype.StateCancelled) {
				want = workflow.Skip
			}
			ok := false
			for _, f := range fins {
				if f.t.xid == out.xid && f.t.new != "done" && f.policy == want {
					ok = true
				}
			}
			if !ok {
				bad("%s in transaction %s, where no dependency with policy %s failed", out.new, out.xid, want)
			}
		default:
			bad("left waiting for %s", out.new)
		}
		for _, r := range runs[d.key()] {
			if r.claimedAt.Before(out.at.Add(-time.Millisecond)) {
				bad("a run claimed at %s, before it left waiting at %s", stamp(r.claimedAt), stamp(out.at))
			}
		}
		row, ok := rows[d.key()]
		switch n := len(effects[d.key()]); {
		case n > 1:
			bad("%d effects", n)
		case ok && row.state == "done" && n != 1:
			bad("done with %d effects", n)
		case ok && row.state != "done" && n != 0:
			bad("%s with %d effects", row.state, n)
		}
	}
	m.ops["(wf released)"] += released
	m.ops["(wf failed or skipped)"] += failed
	m.ops["(wf chain-cancelled)"] += chainCancelled
}

// checkResults checks the stored results (set-result): a row holds one exactly
// when it is done, and it is the result of the run whose effect committed.
func (m *model) checkResults(ctx context.Context, v *violations, effects map[key][]modelEffect) {
	rs, err := m.s.admin.Query(ctx, `SELECT queue, task_id, state, result FROM delayq_outbox`)
	if err != nil {
		m.s.t.Fatal(err)
	}
	var (
		k      key
		st     string
		result []byte
	)
	if _, err := pgx.ForEachRow(rs, []any{&k.queue, &k.id, &st, &result}, func() error {
		switch efs := effects[k]; {
		case st != "done" && result != nil:
			v.add("result", "%s: %s with the result %q (a run's result commits with its completion alone)", k, st, result)
		case st == "done" && result == nil:
			v.add("result", "%s: done without its result", k)
		case st == "done":
			found := false
			for _, e := range efs {
				found = found || string(modelResult(e.inc, e.version, e.attempt)) == string(result)
			}
			if !found {
				v.add("result", "%s: result %q is no committed effect's (%v)", k, result, efs)
			}
		}
		return nil
	}); err != nil {
		m.s.t.Fatal(err)
	}
}

// retriedDependents counts the dependents of q whose version a dead retry of
// the whole queue bumped (rows: the queue's rows read after it).
func (m *model) retriedDependents(q string, rows map[string][2]any) int {
	n := 0
	for _, d := range m.wfOrder {
		if r, ok := rows[d.id]; ok && d.q == q && r[0].(int) == d.version+1 {
			d.version++
			d.log = append(d.log, fmt.Sprintf("%7.3fs dead retry --all: version %d", time.Since(m.start).Seconds(), d.version))
			n++
		}
	}
	return n
}
