package faults

// The batches of the model test (issue 33 item 6): a batch of new children
// (workflow.Client.Batch) with a callback, among the model's tasks and under
// its faults (worker and relay SIGKILL, Redis loss, a Postgres crash, children
// that die, cancels, dead retries and purges), and the cancel of a whole batch
// (workflow.Client.Cancel). The children are ordinary model tasks, checked as
// every task is; the callback's handler reads the batch's counts in its own
// transaction and records them with its effect. The checker requires of every
// batch: the callback left waiting exactly once, in the transaction of a
// child's first finish, after every child's first finish (by the record's
// order); no run of it claimed before; the counts — read by the callback's
// committed run and, at the end, from the counter row — equal the children's
// first finishes (done, dead, cancelled), none remaining.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/workflow"
)

// A callback's id starts with batchCallbackPrefix: its handler records the
// counts it reads (recordBatchCounts).
const batchCallbackPrefix = "cb"

// sqlModelBatch is the table of the counts a callback's run read, written in
// its transaction with its effect: committed with the completion, or not at all.
const sqlModelBatch = `
CREATE TABLE model_batch_counts (
	queue text NOT NULL, task_id text NOT NULL, version int NOT NULL, attempt int NOT NULL,
	total int NOT NULL, remaining int NOT NULL, done int NOT NULL, dead int NOT NULL, cancelled int NOT NULL);`

// recordBatchCounts is the part of a callback's effect that reads its batch's
// counts, in the run's transaction.
func recordBatchCounts(ctx context.Context, tx pgx.Tx, wf *workflow.Client, t *delayq.Task) error {
	if !strings.HasPrefix(t.ID, batchCallbackPrefix) {
		return nil
	}
	c, err := wf.BatchCounts(ctx, tx, t.Queue, t.ID)
	if err != nil {
		return fmt.Errorf("batch counts: %w", err)
	}
	_, err = tx.Exec(ctx, `INSERT INTO model_batch_counts VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		t.Queue, t.ID, t.Version, t.Attempt, c.Total, c.Remaining, c.Done, c.Dead, c.Cancelled)
	return err
}

// mbatch is a batch the model enqueued.
type mbatch struct {
	cb       key
	children []key
	state    delayqtype.State // the callback's, as the enqueue committed it
	// cancelled: a batch cancel committed (the callback is then cancelled, or
	// finished before).
	cancelled bool
	// version is the callback's, bumped by dead retries of its queue (a
	// callback may die as any task).
	version int
	log     []string
}

func (b *mbatch) logf(m *model, format string, args ...any) {
	b.log = append(b.log, fmt.Sprintf("%7.3fs ", time.Since(m.start).Seconds())+fmt.Sprintf(format, args...))
}

// opBatch commits a batch of one to eight new children with a callback.
func (m *model) opBatch(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := m.s.admin.Begin(ctx)
	if err != nil {
		m.s.t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after the commit
	m.nextID++
	b := &mbatch{cb: key{m.queue(), fmt.Sprintf("%s%04d", batchCallbackPrefix, m.nextID)}, version: 1}
	cbDelay := time.Duration(0)
	if m.rng.IntN(3) == 0 {
		cbDelay, _ = m.delay()
	}
	callback := outbox.Task{Queue: b.cb.queue, ID: b.cb.id, Payload: modelPayload(1), Delay: cbDelay, MaxAttempts: 2 + m.rng.IntN(4), Priority: modelPriority(b.cb.id)}
	var (
		news     []*mtask
		children []outbox.Task
	)
	for range 1 + m.rng.IntN(8) {
		m.nextID++
		t := &mtask{q: m.queue(), id: fmt.Sprintf("b%04d", m.nextID)}
		d, _ := m.delay()
		news = append(news, t)
		children = append(children, outbox.Task{Queue: t.q, ID: t.id, Payload: modelPayload(1), Delay: d, MaxAttempts: 2 + m.rng.IntN(4), Priority: modelPriority(t.id)})
		b.children = append(b.children, t.key())
	}
	r, err := m.wf.Batch(ctx, tx, callback, children)
	if err != nil {
		m.s.t.Fatalf("batch %s: %v", b.cb, err)
	}
	if r.Duplicate || r.Children != len(children) || r.Duplicates != 0 {
		m.violation(nil, "batch %s of %d new children: %+v", b.cb, len(children), r)
	}
	// The children's run times, as the rows hold them (Batch reports the
	// callback's alone).
	runAt := map[key]time.Time{}
	rs, err := tx.Query(ctx, `SELECT queue, task_id, run_at FROM delayq_outbox WHERE (queue, task_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`,
		keyQueues(b.children), keyIDs(b.children))
	if err != nil {
		m.s.t.Fatalf("read the children: %v", err)
	}
	var (
		k  key
		at time.Time
	)
	if _, err := pgx.ForEachRow(rs, []any{&k.queue, &k.id, &at}, func() error { runAt[k] = at; return nil }); err != nil {
		m.s.t.Fatalf("read the children: %v", err)
	}
	var st string
	if err := tx.QueryRow(ctx, `SELECT state FROM delayq_outbox WHERE queue = $1 AND task_id = $2`, b.cb.queue, b.cb.id).Scan(&st); err != nil {
		m.s.t.Fatalf("read the callback: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		m.s.t.Fatalf("commit batch: %v", err)
	}
	b.state = delayqtype.State(st)
	if b.state != delayqtype.StateWaiting {
		m.violation(nil, "batch %s of %d children: callback %s, want waiting", b.cb, len(children), st)
	}
	for i, t := range news {
		m.tasks[t.key()] = t
		m.order = append(m.order, t)
		m.begin(t, children[i].MaxAttempts, runAt[t.key()])
		m.logf(t, "enqueue as a child of the batch %s: run_at %s", b.cb, stamp(runAt[t.key()]))
	}
	m.batches[b.cb] = b
	m.batchOrder = append(m.batchOrder, b)
	b.logf(m, "enqueued %s with %d children %v, callback delay %v", b.state, len(b.children), b.children, cbDelay)
	m.logf(nil, "batch %s: %d children", b.cb, len(b.children))
}

func keyQueues(ks []key) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = k.queue
	}
	return out
}

func keyIDs(ks []key) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = k.id
	}
	return out
}

// opBatchCancel cancels a batch (workflow.Client.Cancel on its callback or one
// of its children): in one transaction, the children not finished and the
// callback. The children it cancelled are known cancelled from then on.
func (m *model) opBatchCancel(ctx context.Context) {
	var open []*mbatch
	for _, b := range m.batchOrder {
		if !b.cancelled {
			open = append(open, b)
		}
	}
	if len(open) == 0 {
		return
	}
	b := open[m.rng.IntN(len(open))]
	via := b.cb
	if m.rng.IntN(2) == 0 {
		via = b.children[m.rng.IntN(len(b.children))]
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := m.s.admin.Begin(ctx)
	if err != nil {
		m.s.t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after the commit
	// A child already finished names no batch (workflow.Client.Cancel): the
	// cancel then walks its dependencies alone, and the batch goes on.
	var viaState string
	if err := tx.QueryRow(ctx, `SELECT state FROM delayq_outbox WHERE queue = $1 AND task_id = $2`, via.queue, via.id).Scan(&viaState); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		m.s.t.Fatalf("read %s: %v", via, err)
	}
	whole := via == b.cb || viaState != "" && !modelFinished(viaState)
	n, err := m.wf.Cancel(ctx, tx, via.queue, via.id)
	switch {
	case errors.Is(err, outbox.ErrNotFound) && viaState == "":
		b.logf(m, "cancel via %s: not found (pruned or purged)", via)
		return
	case err != nil:
		m.s.t.Fatalf("batch cancel %s via %s (%q): %v", b.cb, via, viaState, err)
	}
	if !whole {
		if err := tx.Commit(ctx); err != nil {
			m.s.t.Fatalf("commit cancel: %v", err)
		}
		b.logf(m, "cancel via the finished child %s (%s): %d cancelled, the batch goes on", via, viaState, n)
		if n != 0 {
			m.violation(nil, "cancel via %s, a finished child of the batch %s: %d cancelled", via, b.cb, n)
		}
		return
	}
	states := map[key]string{}
	counted := map[key]bool{} // a child whose first finish was counted: it names no batch any more
	all := append([]key{b.cb}, b.children...)
	rs, err := tx.Query(ctx, `SELECT queue, task_id, state, batch_id IS NULL FROM delayq_outbox WHERE (queue, task_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`,
		keyQueues(all), keyIDs(all))
	if err != nil {
		m.s.t.Fatalf("read the batch: %v", err)
	}
	var (
		k    key
		st   string
		left bool
	)
	if _, err := pgx.ForEachRow(rs, []any{&k.queue, &k.id, &st, &left}, func() error { states[k], counted[k] = st, left; return nil }); err != nil {
		m.s.t.Fatalf("read the batch: %v", err)
	}
	cutAt := time.Now() // before the commit, as reschedule's
	if err := tx.Commit(ctx); err != nil {
		m.s.t.Fatalf("commit batch cancel: %v", err)
	}
	b.cancelled = true
	if st, ok := states[b.cb]; ok && !modelFinished(st) {
		m.violation(nil, "batch cancel of %s: the callback is %s after it", b.cb, st)
	}
	for _, c := range b.children {
		t := m.tasks[c]
		switch st, ok := states[c]; {
		case !ok:
		case !modelFinished(st) && counted[c]:
			// Finished once (counted, so it left the batch) and then retried
			// from dead: it runs outside the batch, which does not cancel it.
			m.logf(t, "batch cancel of %s: left running (%s): counted at its first finish", b.cb, st)
		case !modelFinished(st):
			m.violation(t, "batch cancel of %s: the child is %s after it", b.cb, st)
		case st == "cancelled" && (t.k == kOpen || t.k == kMaybeGone):
			t.k = kCancelled
			t.cuts = append(t.cuts, leaseCut{cutAt, t.inc, t.version + 1})
			m.logf(t, "batch cancel of %s: cancelled (version %d)", b.cb, t.version)
		}
	}
	b.logf(m, "cancel via %s: %d cancelled", via, n)
	m.logf(nil, "batch cancel %s via %s: %d cancelled", b.cb, via, n)
}

// retriedCallbacks counts the callbacks of q whose version a dead retry of the
// whole queue bumped (rows: the queue's rows read after it).
func (m *model) retriedCallbacks(q string, rows map[string][2]any) int {
	n := 0
	for _, b := range m.batchOrder {
		if r, ok := rows[b.cb.id]; ok && b.cb.queue == q && r[0].(int) == b.version+1 {
			b.version++
			b.logf(m, "dead retry --all: version %d", b.version)
			n++
		}
	}
	return n
}

// checkBatches checks every batch against the recorded transitions and counts.
func (m *model) checkBatches(ctx context.Context, v *violations, rows map[key]modelRow, runs map[key][]modelRun, effects map[key][]modelEffect) {
	trans := m.transitions(ctx)
	type counts struct{ total, remaining, done, dead, cancelled int }
	reads := map[key][]counts{}
	rs, err := m.s.admin.Query(ctx, `SELECT queue, task_id, total, remaining, done, dead, cancelled FROM model_batch_counts`)
	if err != nil {
		m.s.t.Fatal(err)
	}
	var (
		k key
		c counts
	)
	if _, err := pgx.ForEachRow(rs, []any{&k.queue, &k.id, &c.total, &c.remaining, &c.done, &c.dead, &c.cancelled}, func() error {
		reads[k] = append(reads[k], c)
		return nil
	}); err != nil {
		m.s.t.Fatal(err)
	}
	finished := func(s string) bool { return s == "done" || s == "dead" || s == "cancelled" }
	released := 0
	for _, b := range m.batchOrder {
		bad := func(format string, args ...any) {
			hist := "\n      history: " + strings.Join(b.log, "\n               ")
			for _, t := range trans[b.cb] {
				hist += fmt.Sprintf("\n      %d %s -> %s v%d xid %s at %s", t.seq, t.old, t.new, t.version, t.xid, stamp(t.at))
			}
			v.add("batch", "%s: %s%s", b.cb, fmt.Sprintf(format, args...), hist)
		}
		ts := trans[b.cb]
		if len(ts) == 0 || ts[0].old != "" || ts[0].new != string(b.state) {
			bad("first recorded state is not the enqueue's %s", b.state)
			continue
		}
		// Each child's first finish: it alone is counted.
		want := counts{total: len(b.children)}
		type first struct {
			t transitionRow
			k key
		}
		var firsts []first
		xids := map[string]key{}
		for _, ck := range b.children {
			var f *transitionRow
			for _, t := range trans[ck] {
				if finished(t.new) && !finished(t.old) {
					f = &t
					break
				}
			}
			if f == nil {
				want.remaining++
				bad("child %s never finished", ck)
				continue
			}
			switch f.new {
			case "done":
				want.done++
			case "dead":
				want.dead++
			default:
				want.cancelled++
			}
			xids[f.xid] = ck
			firsts = append(firsts, first{*f, ck})
		}
		var outs []transitionRow
		for _, t := range ts {
			if t.old == string(delayqtype.StateWaiting) {
				outs = append(outs, t)
			}
		}
		if row, ok := rows[b.cb]; ok && row.state == string(delayqtype.StateWaiting) {
			bad("callback still waiting after the system settled (counts want %+v)", want)
			continue
		}
		if len(outs) != 1 {
			bad("callback left waiting %d times, want exactly once", len(outs))
			continue
		}
		out := outs[0]
		released++
		if _, ok := xids[out.xid]; !ok {
			bad("callback left waiting (seq %d) in transaction %s, which finished none of its children", out.seq, out.xid)
		}
		for _, f := range firsts {
			// The batch's trigger fires before model_note: in the release's own
			// transaction the callback's change is noted before its child's.
			if f.t.xid != out.xid && f.t.seq > out.seq {
				bad("callback left waiting (seq %d) before %s's first finish (seq %d, xid %s)", out.seq, f.k, f.t.seq, f.t.xid)
			}
		}
		if out.new != string(delayqtype.StatePending) && !(b.cancelled && out.new == string(delayqtype.StateCancelled)) {
			bad("callback left waiting for %s", out.new)
		}
		for _, r := range runs[b.cb] {
			if r.claimedAt.Before(out.at.Add(-time.Millisecond)) {
				bad("a run of the callback claimed at %s, before it left waiting at %s", stamp(r.claimedAt), stamp(out.at))
			}
		}
		// The counts the callback's committed run read, and the counter row's.
		for _, got := range reads[b.cb] {
			if got != want {
				bad("the callback's run read the counts %+v, the children's first finishes say %+v", got, want)
			}
		}
		row, ok := rows[b.cb]
		switch n := len(effects[b.cb]); {
		case n > 1:
			bad("callback with %d effects", n)
		case ok && row.state == "done" && (n != 1 || len(reads[b.cb]) != 1):
			bad("callback done with %d effects and %d reads of its counts", n, len(reads[b.cb]))
		case ok && row.state != "done" && n != 0:
			bad("callback %s with %d effects", row.state, n)
		}
		if ok {
			got, err := m.wf.BatchCounts(ctx, m.s.admin, b.cb.queue, b.cb.id)
			switch {
			case err != nil:
				bad("BatchCounts: %v", err)
			case (counts{got.Total, got.Remaining, got.Done, got.Dead, got.Cancelled}) != want || got.FinishedAt.IsZero():
				bad("BatchCounts %+v, the children's first finishes say %+v", got, want)
			}
		}
	}
	m.ops["(batch callbacks released)"] += released
}

// transitions reads model_transitions by task, in order.
func (m *model) transitions(ctx context.Context) map[key][]transitionRow {
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
	return trans
}
