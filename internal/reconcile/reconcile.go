package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/transition"
	"github.com/delayq/delayq/internal/validate"
)

type (
	Bucket        = delayqtype.Bucket
	Report        = delayqtype.Report
	Inconsistency = delayqtype.Inconsistency
)

// sample keeps queue/id among b's samples while it holds fewer than limit.
func sample(b *Bucket, queue, id string, limit int) {
	if len(b.Samples) < limit {
		b.Samples = append(b.Samples, queue+"/"+id)
	}
}

// Reconcile compares the outbox with Redis, queue by queue, and repairs Redis from
// Postgres (see the package documentation). It returns the report so far with an
// error. With Options.DryRun it changes nothing.
func Reconcile(ctx context.Context, db DB, dq *dispatch.Client, opts Options) (Report, error) {
	e, err := newEngine(db, dq, opts)
	if err != nil {
		return Report{}, err
	}
	err = e.run(ctx)
	return *e.rep, err
}

// Check lists every inconsistency between the outbox and Redis, and inside Redis
// (a task hash and its ZSET memberships), without changing anything. Each one found
// is read again before it is listed, so that a task caught between two steps of a
// worker or a relay is not reported; on a live system an inconsistency can still
// show up that the next step of its worker resolves. Options.DryRun is ignored.
func Check(ctx context.Context, db DB, dq *dispatch.Client, opts Options) ([]Inconsistency, error) {
	opts.DryRun = true
	e, err := newEngine(db, dq, opts)
	if err != nil {
		return nil, err
	}
	var out []Inconsistency
	e.found = func(q, id string, r *row, p *dispatch.Probe, k Kind) {
		inc := Inconsistency{Kind: k, Queue: q, ID: id, Postgres: describeRow(r), Redis: "not read"}
		if p != nil {
			inc.Redis = describeProbe(*p)
		}
		out = append(out, inc)
	}
	err = e.run(ctx)
	return out, err
}

type engine struct {
	db  DB
	dq  *dispatch.Client
	ops *transition.Ops // the repairs
	o   Options
	st  taskstate.Statements
	rep *Report
	// found, when set, gets every inconsistency (Check).
	found func(queue, id string, r *row, p *dispatch.Probe, k Kind)
	// progress state
	queueIndex, queues int
	// shards holds each queue's shard count as Postgres holds it, which the
	// probes and repairs route by (shardsOf).
	shards map[string]int
}

func newEngine(db DB, dq *dispatch.Client, opts Options) (*engine, error) {
	if db == nil || dq == nil {
		return nil, fmt.Errorf("%w: nil database or Redis client", ErrInvalidOptions)
	}
	o, st, err := opts.prepare()
	if err != nil {
		return nil, err
	}
	rep := &Report{DryRun: o.DryRun, Kinds: make(map[Kind]*Bucket)}
	for _, k := range AllKinds() {
		rep.Kinds[k] = &Bucket{}
	}
	return &engine{db: db, dq: dq, ops: o.ops(dq), o: o, st: st, rep: rep, shards: map[string]int{}}, nil
}

// shardsOf returns queue q's shard count as Postgres holds it, read once per queue
// of a run (or of a pass: Pass.Step reads it again at the queue's first page) and
// with fresh true. The probes and repairs route by it, never by the count Redis
// holds: after a Redis loss, until the controls are mirrored back, that count is
// gone, and a restore routed by it would put a task of a sharded queue into shard
// 0, a second copy beside the one the relay's round put into its own shard (issue
// 29). The count changes only while the queue is empty, so a pass never sees a
// task moved under another.
func (e *engine) shardsOf(ctx context.Context, q string, fresh bool) (int, error) {
	if n, ok := e.shards[q]; ok && !fresh {
		return n, nil
	}
	n, err := taskstate.New(taskstate.Config{Schema: e.o.Schema}).QueueShards(ctx, e.db, q)
	if err != nil {
		if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "42703") {
			n = 1 // an outbox without queue controls (before 00004) or shards (00014)
		} else {
			return 0, fmt.Errorf("reconcile: %w", err)
		}
	}
	e.shards[q] = n
	return n, nil
}

// probe is Probe routed by q's shard count in Postgres.
func (e *engine) probe(ctx context.Context, q string, ids ...string) (time.Time, []dispatch.Probe, error) {
	n, err := e.shardsOf(ctx, q, false)
	if err != nil {
		return time.Time{}, nil, err
	}
	now, probes, err := e.dq.ProbeRouted(ctx, q, n, ids...)
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("reconcile: %w", err)
	}
	return now, probes, nil
}

// repairIf repairs tasks of q whose rows tx holds locked, routed by q's shard
// count in Postgres.
func (e *engine) repairIf(ctx context.Context, tx pgx.Tx, q string, repairs ...dispatch.Repair) ([]bool, error) {
	n, err := e.shardsOf(ctx, q, false)
	if err != nil {
		return nil, err
	}
	applied, err := e.ops.Repair(ctx, tx, q, n, repairs...)
	if err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	return applied, nil
}

func (e *engine) run(ctx context.Context) error {
	start := time.Now()
	defer func() {
		e.rep.Duration = time.Since(start)
	}()
	var err error
	if e.rep.Controls, err = RestoreControls(ctx, e.db, e.dq, e.o); err != nil {
		return err
	}
	qs, err := queuesOf(ctx, e.db, e.dq, e.st, e.o)
	if err != nil {
		return err
	}
	e.rep.Queues = qs
	e.queues = len(qs)
	for i, q := range qs {
		e.queueIndex = i + 1
		if err := e.walkPostgres(ctx, q); err != nil {
			return err
		}
		if err := e.walkRedis(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// queuesOf returns the queues asked for, or every queue of the outbox and of Redis
// (the queue registry, and with deep a SCAN of the keyspace too) and AlsoQueues.
func queuesOf(ctx context.Context, db DB, dq *dispatch.Client, st taskstate.Statements, o Options) ([]string, error) {
	asked, deep := o.Queues, o.Deep
	seen := map[string]bool{}
	if asked != nil {
		for _, q := range asked {
			seen[q] = true
		}
	} else {
		rows, err := db.Query(ctx, st.AllQueues)
		if err != nil {
			return nil, fmt.Errorf("reconcile: list queues: %w", err)
		}
		qs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("reconcile: list queues: %w", err)
		}
		rq, err := dq.RegisteredQueues(ctx)
		if err != nil {
			return nil, fmt.Errorf("reconcile: %w", err)
		}
		if deep {
			scanned, err := dq.Queues(ctx)
			if err != nil {
				return nil, fmt.Errorf("reconcile: %w", err)
			}
			rq = append(rq, scanned...)
		}
		for _, q := range slices.Concat(qs, rq, o.AlsoQueues) {
			if validate.Queue(q) == nil { // a row the validation would refuse has no Redis side
				seen[q] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for q := range seen {
		out = append(out, q)
	}
	slices.Sort(out)
	return out, nil
}

func (e *engine) progress(q, phase string, done, total int) {
	if e.o.Progress != nil {
		e.o.Progress(Progress{Queue: q, Phase: phase, Done: done, Total: total,
			QueueIndex: e.queueIndex, Queues: e.queues, Found: e.rep.Found})
	}
}

// walkPostgres pages through the outbox rows of queue q in key order and settles
// those Redis disagrees with.
func (e *engine) walkPostgres(ctx context.Context, q string) error {
	if _, err := e.shardsOf(ctx, q, true); err != nil {
		return err
	}
	total := 0
	if e.o.Progress != nil {
		if err := e.db.QueryRow(ctx, e.st.CountQueue, q).Scan(&total); err != nil {
			return fmt.Errorf("reconcile: count %s: %w", q, err)
		}
	}
	after, done := "", 0
	for {
		rows, err := e.db.Query(ctx, e.st.Page, q, after, e.o.BatchSize)
		if err != nil {
			return fmt.Errorf("reconcile: read %s: %w", q, err)
		}
		page, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
			var x row
			err := r.Scan(&x.ID, &x.State, &x.Version)
			return x, err
		})
		if err != nil {
			return fmt.Errorf("reconcile: read %s: %w", q, err)
		}
		if len(page) == 0 {
			break
		}
		after = page[len(page)-1].ID
		if err := e.comparePage(ctx, q, page); err != nil {
			return err
		}
		done += len(page)
		e.rep.Rows += len(page)
		e.progress(q, "postgres", done, total)
		if len(page) < e.o.BatchSize {
			break
		}
	}
	return nil
}

// comparePage probes what Redis holds of a page of rows of queue q and settles
// those it disagrees with.
func (e *engine) comparePage(ctx context.Context, q string, page []row) error {
	// Rows whose id Redis could not hold (written around the producer's
	// validation) are left out: they have no Redis side to compare.
	var ids []string
	var valid []row
	for _, r := range page {
		if validate.TaskID(r.ID) == nil {
			ids = append(ids, r.ID)
			valid = append(valid, r)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	now, probes, err := e.probe(ctx, q, ids...)
	if err != nil {
		return err
	}
	var cands []string
	first := map[string]Kind{}
	for i := range valid {
		v := classify(&valid[i], probes[i], now, e.o.Grace)
		if v.expired {
			e.rep.ExpiredLeases.Found++
			e.rep.ExpiredLeases.Skipped++
			sample(&e.rep.ExpiredLeases, q, ids[i], e.o.Samples)
		}
		if v.kind != "" {
			cands = append(cands, ids[i])
			first[ids[i]] = v.kind
		}
	}
	if len(cands) == 0 {
		return nil
	}
	return e.settle(ctx, q, cands, first, 0)
}

// Pass compares the queued rows of the outbox with Redis a page at a time, and
// repairs what disagrees through the compare-and-set path of Reconcile: the
// relay's continuous anti-entropy. Rows are read in key order, so a caller can
// spread a pass over time and resume it from the last id. Safe beside running
// relays and workers, as Reconcile is.
type Pass struct{ e *engine }

// NewPass prepares a pass with opts (Queues, DryRun and Progress are not used).
func NewPass(db DB, dq *dispatch.Client, opts Options) (*Pass, error) {
	opts.DryRun, opts.Queues, opts.Progress = false, nil, nil
	e, err := newEngine(db, dq, opts)
	if err != nil {
		return nil, err
	}
	return &Pass{e: e}, nil
}

// Step compares up to Options.BatchSize queued rows of queue whose ids sort after
// after ("" for the first), repairs what disagrees, and returns the last id it read
// ("" when the queue has no more) and how many rows it read.
func (p *Pass) Step(ctx context.Context, queue, after string) (last string, n int, err error) {
	if _, err := p.e.shardsOf(ctx, queue, after == ""); err != nil {
		return "", 0, err
	}
	rows, err := p.e.db.Query(ctx, p.e.st.PageQueued, queue, after, p.e.o.BatchSize)
	if err != nil {
		return "", 0, fmt.Errorf("reconcile: read %s: %w", queue, err)
	}
	page, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.ID, &x.State, &x.Version)
		return x, err
	})
	if err != nil {
		return "", 0, fmt.Errorf("reconcile: read %s: %w", queue, err)
	}
	if len(page) == 0 {
		return "", 0, nil
	}
	if err := p.e.comparePage(ctx, queue, page); err != nil {
		return "", 0, err
	}
	p.e.rep.Rows += len(page)
	if len(page) < p.e.o.BatchSize {
		return "", len(page), nil
	}
	return page[len(page)-1].ID, len(page), nil
}

// Report returns what the pass found and repaired since NewPass or the last Reset.
func (p *Pass) Report() Report {
	r := *p.e.rep
	r.Kinds = make(map[Kind]*Bucket, len(p.e.rep.Kinds))
	for k, b := range p.e.rep.Kinds {
		c := *b
		r.Kinds[k] = &c
	}
	return r
}

// Reset starts the counts of Report anew.
func (p *Pass) Reset() {
	p.e.rep = &Report{Kinds: make(map[Kind]*Bucket)}
	for _, k := range AllKinds() {
		p.e.rep.Kinds[k] = &Bucket{}
	}
}

// walkRedis goes through everything Redis holds for queue q and settles the ids
// the outbox does not know.
func (e *engine) walkRedis(ctx context.Context, q string) error {
	examined := map[string]bool{} // ids without a row, already handled
	var batch []string
	inBatch := map[string]bool{}
	done := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		ids := batch
		batch, inBatch = nil, map[string]bool{}
		rows, err := e.db.Query(ctx, e.st.Exists, q, ids)
		if err != nil {
			return fmt.Errorf("reconcile: read %s: %w", q, err)
		}
		have := make(map[string]bool, len(ids))
		var id string
		if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { have[id] = true; return nil }); err != nil {
			return fmt.Errorf("reconcile: read %s: %w", q, err)
		}
		var orphans []string
		for _, id := range ids {
			if !have[id] {
				orphans = append(orphans, id)
				examined[id] = true
			}
		}
		if len(orphans) == 0 {
			return nil
		}
		e.rep.RedisOnly += len(orphans)
		now, probes, err := e.probe(ctx, q, orphans...)
		if err != nil {
			return err
		}
		var cands []string
		first := map[string]Kind{}
		for i, id := range orphans {
			if v := classify(nil, probes[i], now, e.o.Grace); v.kind != "" {
				cands = append(cands, id)
				first[id] = v.kind
			}
		}
		if len(cands) == 0 {
			return nil
		}
		return e.settle(ctx, q, cands, first, 0)
	}
	var cur dispatch.ScanCursor
	if e.o.Deep {
		cur = dispatch.DeepScanCursor()
	}
	for !cur.Done() {
		ids, next, err := e.dq.ScanIDs(ctx, q, cur, e.o.BatchSize)
		if err != nil {
			return fmt.Errorf("reconcile: %w", err)
		}
		cur = next
		for _, id := range ids {
			done++
			if examined[id] || inBatch[id] || validate.TaskID(id) != nil {
				continue
			}
			inBatch[id] = true
			batch = append(batch, id)
			if len(batch) >= e.o.BatchSize {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		e.progress(q, "redis", done, 0)
	}
	return flush()
}

// settle reads the candidate ids again, decides again and, unless this is a dry
// run, repairs them: with their rows locked, by compare-and-set scripts in Redis.
// first holds the kinds of the first read, for rows that cannot be locked.
func (e *engine) settle(ctx context.Context, q string, ids []string, first map[string]Kind, depth int) error {
	if e.o.beforeSettle != nil {
		e.o.beforeSettle(q, ids)
	}
	if e.o.DryRun {
		return e.verify(ctx, q, ids)
	}
	tx, err := e.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	locked, err := e.readRows(ctx, tx, e.st.Lock, q, ids)
	if err != nil {
		return err
	}
	var rest []string
	for _, id := range ids {
		if locked[id] == nil {
			rest = append(rest, id)
		}
	}
	busy := map[string]bool{}
	if len(rest) > 0 {
		rows, err := tx.Query(ctx, e.st.Exists, q, rest)
		if err != nil {
			return fmt.Errorf("reconcile: read %s: %w", q, err)
		}
		have, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("reconcile: read %s: %w", q, err)
		}
		for _, id := range have {
			busy[id] = true // the row exists but someone else holds it
		}
	}
	var probeIDs []string
	for _, id := range ids {
		if busy[id] {
			e.record(ctx, q, id, first[id], false, true, nil, nil)
			continue
		}
		probeIDs = append(probeIDs, id)
	}
	if len(probeIDs) == 0 {
		return nil
	}
	now, probes, err := e.probe(ctx, q, probeIDs...)
	if err != nil {
		return err
	}
	var repairs []dispatch.Repair
	var kinds []Kind
	var absentRemoved []string
	for i, id := range probeIDs {
		r, p := locked[id], probes[i]
		v := classify(r, p, now, e.o.Grace)
		switch {
		case v.kind == "":
			continue // resolved in the meantime
		case v.op == 0:
			e.record(ctx, q, id, v.kind, false, true, r, &p)
			continue
		}
		rep := dispatch.Repair{Op: v.op, ID: id, Fingerprint: p.Fingerprint}
		if v.op == dispatch.RepairRestore {
			rep.Task = restoreTask(r, p)
		}
		repairs = append(repairs, rep)
		kinds = append(kinds, v.kind)
	}
	if len(repairs) == 0 {
		return tx.Commit(ctx)
	}
	applied, err := e.repairIf(ctx, tx, q, repairs...)
	if err != nil {
		return err
	}
	for i, rp := range repairs {
		e.record(ctx, q, rp.ID, kinds[i], applied[i], !applied[i], locked[rp.ID], nil)
		if applied[i] && locked[rp.ID] == nil {
			absentRemoved = append(absentRemoved, rp.ID)
		}
	}
	e.o.Logger.DebugContext(ctx, "reconcile: repaired", "queue", q, "repairs", len(repairs))
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("reconcile: commit: %w", err)
	}
	if len(absentRemoved) == 0 || depth > 0 {
		return nil
	}
	// A task removed for want of a row whose row appeared meanwhile (an enqueue and
	// a relay raced the removal) is put back.
	now2, err := e.readRows(ctx, e.db, e.st.Lookup, q, absentRemoved)
	if err != nil {
		return err
	}
	var back []string
	for _, id := range absentRemoved {
		if r := now2[id]; r != nil && r.State == delayqtype.StateQueued {
			back = append(back, id)
		}
	}
	if len(back) == 0 {
		return nil
	}
	return e.settle(ctx, q, back, map[string]Kind{}, depth+1)
}

// verify is settle for a dry run: read both sides again, report, change nothing.
func (e *engine) verify(ctx context.Context, q string, ids []string) error {
	rows, err := e.readRows(ctx, e.db, e.st.Lookup, q, ids)
	if err != nil {
		return err
	}
	now, probes, err := e.probe(ctx, q, ids...)
	if err != nil {
		return err
	}
	for i, id := range ids {
		r, p := rows[id], probes[i]
		if v := classify(r, p, now, e.o.Grace); v.kind != "" {
			e.record(ctx, q, id, v.kind, false, v.op == 0, r, &p)
		}
	}
	return nil
}

// record counts one inconsistency.
func (e *engine) record(ctx context.Context, q, id string, k Kind, repaired, skipped bool, r *row, p *dispatch.Probe) {
	if k == "" {
		return
	}
	b := e.rep.Kinds[k]
	b.Found++
	e.rep.Found++
	if repaired {
		b.Repaired++
		e.rep.Repaired++
	}
	if skipped {
		b.Skipped++
		e.rep.Skipped++
	}
	sample(b, q, id, e.o.Samples)
	if e.o.Observer != nil {
		e.o.Observer.Divergence(ctx, Divergence{Queue: q, ID: id, Kind: k, Repaired: repaired, Skipped: skipped})
	}
	if e.found != nil {
		e.found(q, id, r, p, k)
	}
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// readRows runs a statement that selects taskstate.RowColumns of queue q's ids.
func (e *engine) readRows(ctx context.Context, db querier, sql, q string, ids []string) (map[string]*row, error) {
	rows, err := db.Query(ctx, sql, q, ids)
	if err != nil {
		return nil, fmt.Errorf("reconcile: read %s: %w", q, err)
	}
	list, err := pgx.CollectRows(rows, taskstate.ScanRow)
	if err != nil {
		return nil, fmt.Errorf("reconcile: read %s: %w", q, err)
	}
	out := make(map[string]*row, len(list))
	for i := range list {
		out[list[i].ID] = &list[i]
	}
	return out, nil
}
