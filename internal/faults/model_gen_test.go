package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/tempserver"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/workflow"
)

// know is what the model knows of a task's row: the transition table says who
// may change a row without the generator seeing it (the relay, the workers and
// the reaper move a live row to queued, done or dead), so an open task is one of
// pending, queued, done, dead until an operation tells.
type know int

const (
	kOpen      know = iota // pending, queued, done or dead: the system decides
	kDone                  // an operation was refused because it is done
	kDead                  // an operation was refused because it is dead
	kCancelled             // Cancel returned nil
	kGone                  // no row: purged, pruned while known done or cancelled
	kMaybeGone             // open when a prune ran: pruned if it was done, else still there
)

func (k know) String() string {
	return [...]string{"open", "done", "dead", "cancelled", "gone", "maybe-gone"}[k]
}

// incarnation is one life of a task id: from the insert of its row to its
// deletion (prune or purge). Runs and effects carry it in their payload.
type incarnation struct {
	maxAttempts int
	// runAt[v] is the earliest time any run of version v may be claimed (the
	// producer's run_at; for a dead retry the time just before the call).
	runAt map[int]time.Time
	// superseded[v] is when version v+1 committed.
	superseded map[int]time.Time
}

// mtask is the model of one task id.
type mtask struct {
	q, id   string
	inc     int // current incarnation (1 for the first); 0: never committed
	incs    map[int]*incarnation
	k       know
	version int
	// a0 is the row's attempt when the current version began (read in the
	// transaction of the reschedule; 0 for a new task or a dead retry).
	a0 int
	// since is when the current version began.
	since time.Time
	// flushed: Redis was flushed since the current version began (a dead task's
	// record may then be missing from Redis: reconcile does not restore it).
	flushed bool
	// payload is the last payload a replace or debounce wrote ("" while none did).
	payload string
	// cuts are the operations that end a running lease in Redis: a
	// reschedule, replace or debounce (the relay's replacing enqueue), a cancel
	// (the removal). From then on, a run they concern holds its key's slot no
	// longer.
	cuts []leaseCut
	log  []string
}

func (t *mtask) key() key { return key{t.q, t.id} }

func (t *mtask) cur() *incarnation { return t.incs[t.inc] }

// model is the generator and the reference model of one run.
type model struct {
	s       *system
	seed    uint64
	rng     *rand.Rand
	start   time.Time
	tasks   map[key]*mtask
	order   []*mtask
	rolled  map[key]bool // enqueued only in transactions that rolled back
	nextID  int
	relays  *fleet
	workers *fleet
	pg      *tempserver.Postgres // the model's own server, which opPostgresCrash kills
	st      taskstate.Statements
	// The workflow part (model_wf_test.go): the client, and the dependents
	// enqueued through it.
	wf      *workflow.Client
	wfTasks map[key]*mdep
	wfOrder []*mdep
	// chains are the chains opWorkflow enqueued, each in order: a model task,
	// then its dependents (opChainCancel).
	chains [][]key
	// The batches (model_batch_test.go), by their callback.
	batches    map[key]*mbatch
	batchOrder []*mbatch

	kills []time.Time // when a worker was SIGKILLed
	// losses are Redis's data losses: from just before the FLUSHALL to just
	// after it.
	losses []struct{ from, to time.Time }
	spans  []controlSpan // the pauses and rate limits applied, by the Redis clock
	// pgCrashes are the Postgres crashes, each from the kill to the end of the
	// time its broken connections may still fail a run (opPostgresCrash).
	pgCrashes []struct{ from, to time.Time }
	// starvedAt are the claims of the runs whose handler started late
	// (modelRun.starved), found by check.
	starvedAt []time.Time
	ops       map[string]int // operations applied, by name
	oplog     []string
	faults    []string // model-level faults found while generating
}

func newModel(s *system, seed uint64) *model {
	return &model{
		s: s, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x6d6f64656c)), start: time.Now(),
		tasks: map[key]*mtask{}, rolled: map[key]bool{}, ops: map[string]int{}, wf: workflow.New(s.ob), wfTasks: map[key]*mdep{}, batches: map[key]*mbatch{},
		st: taskstate.NewStatements(taskstate.Config{Schema: "public", NotifyChannel: taskstate.DefaultNotifyChannel}),
	}
}

// logf records an operation in the run's log and in the task's.
func (m *model) logf(t *mtask, format string, args ...any) {
	line := fmt.Sprintf("%7.3fs ", time.Since(m.start).Seconds())
	if t != nil {
		line += t.key().String() + " "
	}
	line += fmt.Sprintf(format, args...)
	m.oplog = append(m.oplog, line)
	if t != nil {
		t.log = append(t.log, line)
	}
}

// violation is a fault found while generating: an operation's result the model
// says is impossible.
func (m *model) violation(t *mtask, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	m.logf(t, "VIOLATION %s", msg)
	if t != nil {
		msg = fmt.Sprintf("%s: %s\n      history: %s", t.key(), msg, strings.Join(t.log, "\n               "))
	}
	m.faults = append(m.faults, msg)
}

// generate applies random operations for d.
func (m *model) generate(ctx context.Context, d time.Duration) {
	end := time.Now().Add(d)
	// A few tasks first, so that every operation has something to act on.
	for range 4 {
		m.opEnqueue(ctx)
	}
	type op struct {
		name   string
		weight int
		f      func(context.Context)
	}
	ops := []op{
		{"enqueue", 14, m.opEnqueue},
		{"duplicate", 5, m.opDuplicate},
		{"rollback", 3, m.opRollback},
		{"reschedule", 12, m.opReschedule},
		{"cancel", 5, m.opCancel},
		{"dead-retry", 5, m.opRetryDead},
		{"dead-retry-all", 1, m.opRetryAllDead},
		{"dead-purge", 3, m.opPurgeDeadTask},
		{"dead-purge-all", 1, m.opPurgeDead},
		{"prune", 1, m.opPrune},
		{"worker-kill", 2, m.opWorkerKill},
		{"relay-kill", 2, m.opRelayKill},
		{"redis-flush", 2, m.opFlush},
		{"redis-loss-relay-down", 1, m.opRedisLossRelayDown},
		{"held-open", 4, m.opHeldOpen},
		{"pause", 2, m.opPause},
		{"rate-limit", 2, m.opRateLimit},
		{"postgres-crash", 1, m.opPostgresCrash},
		{"sharded-burst", 4, m.opShardedBurst},
		{"reshard", 2, m.opReshard},
		{"workflow", 12, m.opWorkflow},
		{"batch", 5, m.opBatch},
		{"batch-cancel", 2, m.opBatchCancel},
		{"chain-cancel", 2, m.opChainCancel},
		{"keyed", 8, m.opKeyed},
		{"replace", 5, m.opReplace},
		{"debounce-burst", 3, m.opDebounceBurst},
		{"wait", 10, m.opWait},
	}
	total := 0
	for _, o := range ops {
		total += o.weight
	}
	for time.Now().Before(end) && ctx.Err() == nil {
		n := m.rng.IntN(total)
		for _, o := range ops {
			if n -= o.weight; n < 0 {
				m.ops[o.name]++
				o.f(ctx)
				break
			}
		}
		pause(ctx, time.Duration(20+m.rng.IntN(100))*time.Millisecond)
	}
}

// pick returns a random task for which ok holds, or nil.
func (m *model) pick(ok func(*mtask) bool) *mtask {
	var c []*mtask
	for _, t := range m.order {
		if ok(t) {
			c = append(c, t)
		}
	}
	if len(c) == 0 {
		return nil
	}
	return c[m.rng.IntN(len(c))]
}

// delay is a due time for a new task or a reschedule: now, soon, later within
// the horizon, or beyond it.
func (m *model) delay() (time.Duration, string) {
	switch n := m.rng.IntN(10); {
	case n < 3:
		return 0, "now"
	case n < 6:
		return time.Duration(m.rng.IntN(500)) * time.Millisecond, "soon"
	case n < 8:
		return time.Duration(800+m.rng.IntN(1000)) * time.Millisecond, "later"
	default:
		return modelHorizon + time.Duration(300+m.rng.IntN(2000))*time.Millisecond, "beyond-horizon"
	}
}

// begin starts an incarnation of t at version 1.
func (m *model) begin(t *mtask, maxAttempts int, runAt time.Time) {
	t.inc++
	if t.incs == nil {
		t.incs = map[int]*incarnation{}
	}
	t.incs[t.inc] = &incarnation{maxAttempts: maxAttempts, runAt: map[int]time.Time{1: runAt}, superseded: map[int]time.Time{}}
	t.k, t.version, t.a0, t.since, t.flushed, t.payload = kOpen, 1, 0, time.Now(), false, ""
}

// opEnqueue commits a transaction of one to three new tasks (sometimes with a
// duplicate of an existing one).
func (m *model) opEnqueue(ctx context.Context) {
	n := 1 + m.rng.IntN(3)
	var news []*mtask
	var tasks []outbox.Task
	var descs []string
	for range n {
		m.nextID++
		t := &mtask{q: m.queue(), id: fmt.Sprintf("m%04d", m.nextID)}
		d, what := m.delay()
		ma := 2 + m.rng.IntN(4)
		news = append(news, t)
		tasks = append(tasks, outbox.Task{Queue: t.q, ID: t.id, Payload: modelPayload(1), Delay: d, MaxAttempts: ma, Priority: modelPriority(t.id)})
		descs = append(descs, fmt.Sprintf("%s/%s delay %v (%s) max %d", t.q, t.id, d, what, ma))
	}
	var dup *mtask
	if m.rng.IntN(5) == 0 {
		dup = m.pick(func(t *mtask) bool { return t.k != kGone && t.k != kMaybeGone })
		if dup != nil {
			tasks = append(tasks, outbox.Task{Queue: dup.q, ID: dup.id, Payload: modelPayload(dup.inc + 1), MaxAttempts: 2, ConcurrencyKey: modelKeyOf(dup.id)})
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := m.s.admin.Begin(ctx)
	if err != nil {
		m.s.t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after the commit: nothing to roll back
	res, err := m.s.ob.EnqueueMany(ctx, tx, tasks)
	if err != nil {
		m.s.t.Fatalf("enqueue %v: %v", descs, err)
	}
	if err := tx.Commit(ctx); err != nil {
		m.s.t.Fatalf("commit enqueue: %v", err)
	}
	for i, t := range news {
		r := res.Results[i]
		m.tasks[t.key()] = t
		m.order = append(m.order, t)
		if r.Duplicate {
			m.violation(t, "new task reported a duplicate")
			continue
		}
		m.begin(t, tasks[i].MaxAttempts, r.RunAt)
		m.logf(t, "enqueue %s: run_at %s", descs[i], stamp(r.RunAt))
	}
	if dup != nil {
		if !res.Results[len(res.Results)-1].Duplicate {
			m.violation(dup, "enqueue of an existing id (model: %s) in a batch was not a duplicate", dup.k)
		} else {
			m.logf(dup, "duplicate enqueue (in a batch): reported duplicate")
		}
	}
}

// opDuplicate enqueues an id that was used before, alone: a duplicate while its
// row exists, a new incarnation once the row was deleted (id reuse after a prune
// or a purge).
func (m *model) opDuplicate(ctx context.Context) {
	gone := m.rng.IntN(2) == 0 // half the time an id whose row may have been deleted
	t := m.pick(func(t *mtask) bool { return !gone || t.k == kGone || t.k == kMaybeGone })
	if t == nil {
		return
	}
	d, what := m.delay()
	ma := 2 + m.rng.IntN(4)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := m.s.admin.Begin(ctx)
	if err != nil {
		m.s.t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after the commit
	r, err := m.s.ob.Enqueue(ctx, tx, outbox.Task{Queue: t.q, ID: t.id, Payload: modelPayload(t.inc + 1), Delay: d, MaxAttempts: ma, Priority: modelPriority(t.id),
		ConcurrencyKey: modelKeyOf(t.id)}) // a keyed id keeps its key in every incarnation (modelKeyOf)
	if err != nil {
		m.s.t.Fatalf("enqueue %s: %v", t.key(), err)
	}
	if err := tx.Commit(ctx); err != nil {
		m.s.t.Fatalf("commit: %v", err)
	}
	switch {
	case r.Duplicate && t.k == kGone:
		m.violation(t, "enqueue of an id whose row was deleted reported a duplicate")
	case r.Duplicate:
		if t.k == kMaybeGone {
			t.k = kOpen // not pruned: it was not done then (it may be now)
		}
		m.logf(t, "duplicate enqueue: reported duplicate (model %s)", t.k)
	case t.k != kGone && t.k != kMaybeGone:
		m.violation(t, "enqueue of an existing id (model %s) inserted a new row", t.k)
	default:
		m.begin(t, ma, r.RunAt)
		m.ops["(id reused)"]++
		m.logf(t, "reuse of the id: incarnation %d, delay %v (%s) max %d, run_at %s", t.inc, d, what, ma, stamp(r.RunAt))
	}
}

// opRollback enqueues new tasks in a transaction that rolls back.
func (m *model) opRollback(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := m.s.admin.Begin(ctx)
	if err != nil {
		m.s.t.Fatalf("begin: %v", err)
	}
	m.nextID++
	k := key{m.queue(), fmt.Sprintf("r%04d", m.nextID)}
	if _, err := m.s.ob.Enqueue(ctx, tx, outbox.Task{Queue: k.queue, ID: k.id, Payload: modelPayload(1)}); err != nil {
		m.s.t.Fatalf("enqueue: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		m.s.t.Fatalf("rollback: %v", err)
	}
	m.rolled[k] = true
	m.logf(nil, "enqueue %s rolled back", k)
}

// opReschedule moves a task that may be live: earlier, later, or beyond the
// horizon. In the same transaction it reads the new version and the attempts
// the row carries into it.
func (m *model) opReschedule(ctx context.Context) {
	if t := m.pick(func(t *mtask) bool { return t.k == kOpen || t.k == kMaybeGone }); t != nil {
		m.reschedule(ctx, t)
	}
}

// reschedule moves t to a random due time.
func (m *model) reschedule(ctx context.Context, t *mtask) {
	d, what := m.delay()
	runAt := time.Now().Add(d)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := m.s.admin.Begin(ctx)
	if err != nil {
		m.s.t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after the commit
	err = m.s.ob.Reschedule(ctx, tx, t.q, t.id, runAt)
	if err != nil {
		_ = tx.Rollback(ctx)
		m.refused(t, "reschedule", err)
		return
	}
	var version, attempt int
	if err := tx.QueryRow(ctx, `SELECT version, attempt FROM delayq_outbox WHERE queue = $1 AND task_id = $2`, t.q, t.id).Scan(&version, &attempt); err != nil {
		m.s.t.Fatalf("read the rescheduled row: %v", err)
	}
	// The relay may replace the copy in Redis, ending a run's lease, as soon as
	// the commit is done: the cut is taken before it (seed 12522073149441357586:
	// the next version claimed 10 ms after the old one, before the cut taken
	// after the commit).
	cutAt := time.Now()
	if err := tx.Commit(ctx); err != nil {
		m.s.t.Fatalf("commit reschedule: %v", err)
	}
	now := time.Now()
	if t.k == kMaybeGone {
		t.k = kOpen
	}
	if version != t.version+1 {
		m.violation(t, "reschedule made version %d, model expected %d", version, t.version+1)
	}
	inc := t.cur()
	inc.superseded[t.version] = now
	t.version = version
	inc.runAt[version] = runAt
	t.a0, t.since, t.flushed = attempt, now, false
	t.cuts = append(t.cuts, leaseCut{cutAt, t.inc, t.version})
	m.logf(t, "reschedule %s (%s, +%v): version %d, attempt %d", stamp(runAt), what, d, version, attempt)
}

// refused advances the model by an operation on a live task that was refused.
func (m *model) refused(t *mtask, op string, err error) {
	msg := err.Error()
	switch {
	case errors.Is(err, outbox.ErrFinished) || errors.Is(err, reconcile.ErrNotDead):
		var st string
		switch {
		case strings.Contains(msg, "(state done)"):
			st = "done"
		case strings.Contains(msg, "(state dead)"):
			st = "dead"
		case strings.Contains(msg, "(state cancelled)"):
			st = "cancelled"
		case strings.Contains(msg, "(state pending)") || strings.Contains(msg, "(state queued)"):
			st = "live"
		}
		m.learn(t, op, st, msg)
	case errors.Is(err, outbox.ErrNotFound) || errors.Is(err, reconcile.ErrNotFound):
		switch t.k {
		case kMaybeGone, kGone:
			m.logf(t, "%s: not found (pruned)", op)
			t.k = kGone
		default:
			m.violation(t, "%s: not found, but the model holds it %s", op, t.k)
		}
	case strings.Contains(msg, "try again"):
		m.logf(t, "%s: %v", op, err)
	default:
		m.s.t.Fatalf("%s %s: %v", op, t.key(), err)
	}
}

// learn advances the model by a state an operation reported.
func (m *model) learn(t *mtask, op, st, msg string) {
	m.logf(t, "%s refused: %s", op, msg)
	switch {
	case st == "done" && (t.k == kOpen || t.k == kMaybeGone || t.k == kDone):
		t.k = kDone
	case st == "dead" && (t.k == kOpen || t.k == kMaybeGone || t.k == kDead):
		t.k = kDead
	case st == "cancelled" && t.k == kCancelled:
	case st == "cancelled" && (t.k == kOpen || t.k == kMaybeGone):
		t.k = kCancelled // its run cancelled it (run-cancel); the check compares with the plan
	case st == "live" && (t.k == kOpen || t.k == kMaybeGone):
		t.k = kOpen
	default:
		m.violation(t, "%s: the row is %q, but the model holds it %s", op, st, t.k)
	}
}

// opCancel cancels a task that may be live.
func (m *model) opCancel(ctx context.Context) {
	t := m.pick(func(t *mtask) bool { return t.k == kOpen || t.k == kMaybeGone || t.k == kDone })
	if t == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cutAt := time.Now() // before the commit, as reschedule's
	if err := m.s.ob.Cancel(ctx, m.s.admin, t.q, t.id); err != nil {
		m.refused(t, "cancel", err)
		return
	}
	if t.k == kDone {
		m.violation(t, "cancel of a task known done succeeded")
	}
	t.k = kCancelled
	t.cuts = append(t.cuts, leaseCut{cutAt, t.inc, t.version + 1})
	m.logf(t, "cancel: cancelled (version %d)", t.version)
}

// opRetryDead retries one task that may be dead.
func (m *model) opRetryDead(ctx context.Context) {
	t := m.pick(func(t *mtask) bool { return t.k == kDead || t.k == kOpen && m.rng.IntN(3) == 0 })
	if t == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	before := time.Now()
	if err := reconcile.RetryDead(ctx, m.s.admin, reconcile.Options{}, t.q, t.id); err != nil {
		m.refused(t, "dead retry", err)
		return
	}
	if t.k != kDead && t.k != kOpen && t.k != kMaybeGone {
		m.violation(t, "dead retry succeeded on a task the model holds %s", t.k)
	}
	m.retried(t, before, "dead retry")
}

// retried advances the model by a dead retry of t.
func (m *model) retried(t *mtask, before time.Time, op string) {
	inc := t.cur()
	inc.superseded[t.version] = time.Now()
	t.version++
	inc.runAt[t.version] = before.Add(-time.Millisecond)
	t.k, t.a0, t.since, t.flushed = kOpen, 0, before, false
	m.logf(t, "%s: version %d, pending", op, t.version)
}

// rowsOf reads the version of each task of queue q the model may have a row for.
func (m *model) rowsOf(ctx context.Context, q string) map[string][2]any {
	rows, err := m.s.admin.Query(ctx, `SELECT task_id, version, state FROM delayq_outbox WHERE queue = $1`, q)
	if err != nil {
		m.s.t.Fatalf("read rows: %v", err)
	}
	out := map[string][2]any{}
	var (
		id, st string
		v      int
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &v, &st}, func() error {
		out[id] = [2]any{v, st}
		return nil
	}); err != nil {
		m.s.t.Fatalf("read rows: %v", err)
	}
	return out
}

// opRetryAllDead retries every dead task of one queue. The model cannot tell
// which open tasks were dead: it reads the versions after the call, and checks
// that every task it knew dead was retried, that no other changed otherwise, and
// that the count agrees.
func (m *model) opRetryAllDead(ctx context.Context) {
	q := m.queue()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	before := time.Now()
	n, err := reconcile.RetryAllDead(ctx, m.s.admin, reconcile.Options{Queues: []string{q}})
	if err != nil {
		m.violation(nil, "RetryAllDead %s: %v", q, err)
		return
	}
	rows := m.rowsOf(ctx, q)
	bumped := 0
	for _, t := range m.order {
		if t.q != q || (t.k != kDead && t.k != kOpen && t.k != kMaybeGone) {
			continue
		}
		r, ok := rows[t.id]
		switch {
		case !ok && t.k == kMaybeGone:
		case !ok:
			m.violation(t, "RetryAllDead: no row, but the model holds it %s", t.k)
		case r[0].(int) == t.version+1:
			bumped++
			m.retried(t, before, "dead retry --all")
		case r[0].(int) != t.version:
			m.violation(t, "RetryAllDead: version %d, model %d", r[0], t.version)
		case t.k == kDead:
			m.violation(t, "RetryAllDead did not retry a task known dead (now %s)", r[1])
		}
	}
	bumped += m.retriedDependents(q, rows) + m.retriedCallbacks(q, rows)
	m.logf(nil, "dead retry --all %s: %d retried", q, n)
	if bumped != n {
		m.violation(nil, "RetryAllDead %s reported %d, the model saw %d versions bumped", q, n, bumped)
	}
}

// opPurgeDeadTask purges one task that may be dead.
func (m *model) opPurgeDeadTask(ctx context.Context) {
	t := m.pick(func(t *mtask) bool { return t.k == kDead || t.k == kOpen && m.rng.IntN(3) == 0 })
	if t == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := reconcile.PurgeDeadTask(ctx, m.s.admin, m.s.dq, reconcile.Options{}, t.q, t.id); err != nil {
		m.refused(t, "dead purge", err)
		return
	}
	t.k = kGone
	m.logf(t, "dead purge: purged (version %d)", t.version)
}

// opPurgeDead purges every dead task of one queue; like opRetryAllDead, the model
// reads the rows after the call.
func (m *model) opPurgeDead(ctx context.Context) {
	m.purgeDead(ctx, m.queue())
}

// purgeDead purges every dead task of q.
func (m *model) purgeDead(ctx context.Context, q string) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	n, err := reconcile.PurgeDead(ctx, m.s.admin, m.s.dq, reconcile.Options{Queues: []string{q}})
	if err != nil {
		m.violation(nil, "PurgeDead %s: %v", q, err)
		return
	}
	rows := m.rowsOf(ctx, q)
	gone := 0
	for _, t := range m.order {
		if t.q != q || (t.k != kDead && t.k != kOpen && t.k != kMaybeGone) {
			continue
		}
		_, ok := rows[t.id]
		switch {
		case !ok && t.k == kMaybeGone:
			t.k = kGone // pruned before, or purged now: the count cannot tell
			m.logf(t, "dead purge --all: no row")
		case !ok:
			gone++
			t.k = kGone
			m.logf(t, "dead purge --all: purged")
		case t.k == kDead:
			m.violation(t, "PurgeDead left a task known dead")
		}
	}
	m.logf(nil, "dead purge --all %s: %d purged", q, n)
	if gone > n {
		m.violation(nil, "PurgeDead %s reported %d, the model saw %d rows go", q, n, gone)
	}
}

// opPrune runs the relay's retention statement with a retention of zero: every
// done and cancelled row goes.
func (m *model) opPrune(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var deleted int64
	for {
		tag, err := m.s.admin.Exec(ctx, m.st.Prune, int64(0), 1000)
		if err != nil {
			m.s.t.Fatalf("prune: %v", err)
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < 1000 {
			break
		}
	}
	for _, t := range m.order {
		switch t.k {
		case kDone, kCancelled:
			t.k = kGone
			m.logf(t, "prune: gone")
		case kOpen:
			t.k = kMaybeGone
		}
	}
	m.logf(nil, "prune: %d rows deleted", deleted)
}

// opWorkerKill SIGKILLs a worker process (its fleet starts another). A run it
// held is lost: its attempt is counted when the reaper takes the lease back.
func (m *model) opWorkerKill(context.Context) {
	if m.workers.killRandom() {
		m.kills = append(m.kills, time.Now())
		m.logf(nil, "worker SIGKILL")
	}
}

func (m *model) opRelayKill(context.Context) {
	if m.relays.killRandom() {
		m.logf(nil, "relay SIGKILL")
	}
}

// opFlush empties Redis (FLUSHALL), then reconciles it from Postgres.
func (m *model) opFlush(ctx context.Context) {
	from := time.Now()
	if err := m.s.rdb.FlushAll(ctx).Err(); err != nil {
		m.s.t.Fatalf("FLUSHALL: %v", err)
	}
	m.losses = append(m.losses, struct{ from, to time.Time }{from, time.Now()})
	for _, t := range m.order {
		t.flushed = true
	}
	m.logf(nil, "Redis FLUSHALL")
	missing := m.s.reconcile(ctx)
	m.logf(nil, "reconcile: %d missing in Redis restored", missing)
}

func (m *model) opWait(ctx context.Context) {
	pause(ctx, time.Duration(100+m.rng.IntN(600))*time.Millisecond)
}

// expected is the final state of t's current version if no run is lost: the
// planned outcomes from attempt a0+1 on. (A Redis flush loses no run: reconcile
// puts the task back with the attempts Postgres recorded, so an attempt may run
// twice, with the same planned outcome.) certain is false when a slow outcome
// makes the end a race (its run and the next may both finish).
func (m *model) expected(t *mtask) (state string, attempt int, certain bool) {
	inc := t.cur()
	for a := t.a0 + 1; ; a++ {
		o, _ := plan(m.seed, t.q, t.id, t.inc, t.version, a)
		switch o {
		case oSuccess:
			return "done", a - 1, true
		case oNoRetry:
			return "dead", a, true
		case oCancel:
			return "cancelled", a, true
		case oSlow:
			return "", 0, false
		}
		if a >= inc.maxAttempts {
			return "dead", a, true
		}
	}
}

// summary is the count of operations, for the report.
func (m *model) summary() string {
	names := make([]string, 0, len(m.ops))
	for n := range m.ops {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s=%d", n, m.ops[n])
	}
	return strings.Join(parts, " ")
}
