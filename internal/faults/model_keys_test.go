package faults

// Concurrency keys, caps, throttles and replace/debounce in the model test
// (issue 34 item 5). The busy queues have limits per key from the start (ma: 2
// runs of a key at once; mb: 1 at once and 3 starts a second), set before any
// task, never changed. opKeyed commits bursts of keyed tasks due now or soon;
// their handlers record each run's span (model_key_runs), and the checker
// requires that no instant has more runs of a key than its cap, and no window
// more starts than its throttle, with the exceptions docs/DESIGN.md states
// ("Limits and what is not promised") modelled, not the check weakened:
//
//   - a run claimed before a Redis loss is not counted after it (for the rest
//     of its lease);
//   - a run holds its slot only while it holds its lease: a run's span ends at
//     its handler's return, its lease's end (claim + lease: the first worker
//     does not heartbeat, and a slow handler outlives its lease), or a change
//     that ends its lease in Redis (a reschedule, replace or debounce: the
//     relay's replacing enqueue; a cancel: the removal), whichever is first;
//   - a throttle's log goes with a Redis loss: a window is counted from the
//     loss on.
//
// The keyed tasks are ordinary model tasks: no early start, every task
// finishes, nothing lost, exactly one effect, checked as for every task.
//
// opReplace enqueues, with Replace (maybe KeepRunAt) or Debounce (maybe with
// MaxWait), over a task the model holds open: replaced (a new version, its
// payload tagged), refused with ErrRunning (then the row must be queued and
// due), or a duplicate (then the row must be finished). The checker requires
// the row's payload to be the last one the model wrote, and a done row's one
// effect to be of that payload.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/outbox"
)

// keyLimits are the model's limits per concurrency key, by queue.
var keyLimits = map[string]struct {
	cap, throttle int
	window        time.Duration
}{
	"ma": {cap: 2},
	"mb": {cap: 1, throttle: 3, window: time.Second},
}

// modelKeys are the concurrency keys of the keyed tasks.
var modelKeys = []string{"t0", "t1", "t2"}

// sqlModelKeyRuns records the span of every run of a keyed task, outside its
// transaction: the start before the handler's work, the end after it (none
// when its worker was killed meanwhile).
const sqlModelKeyRuns = `
CREATE TABLE model_key_runs (
	id bigserial PRIMARY KEY, queue text NOT NULL, task_id text NOT NULL, ckey text NOT NULL,
	inc int NOT NULL, version int NOT NULL, attempt int NOT NULL, worker text NOT NULL, claimed_at timestamptz NOT NULL,
	started_at timestamptz NOT NULL DEFAULT clock_timestamp(), ended_at timestamptz);`

// modelKeyOf is the concurrency key of a keyed task, from its id ("k0042-t1"):
// the handler does not see the key.
func modelKeyOf(id string) string {
	if !strings.HasPrefix(id, "k") {
		return ""
	}
	_, k, _ := strings.Cut(id, "-")
	return k
}

// keyRunStart records the start of a keyed task's run and returns the record
// of its end (a no-op for a task without a key).
func keyRunStart(ctx context.Context, db *pgxpool.Pool, t *delayq.Task, name string) (end func(), err error) {
	k := modelKeyOf(t.ID)
	if k == "" {
		return func() {}, nil
	}
	var id int64
	if err := db.QueryRow(ctx, `INSERT INTO model_key_runs (queue, task_id, ckey, inc, version, attempt, worker, claimed_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id`,
		t.Queue, t.ID, k, payloadInc(t.Payload), t.Version, t.Attempt, name, t.ClaimedAt).Scan(&id); err != nil {
		return nil, fmt.Errorf("record the keyed run: %w", err)
	}
	// A keyed run lasts 20-150 ms (by its id and attempt), so that the runs of
	// a key overlap and contend for its slots; the runs elsewhere take a few ms.
	pause(ctx, time.Duration(20+(len(t.ID)*7+t.Attempt*31+t.Version*13)%130)*time.Millisecond)
	return func() {
		// Also when the run's context ended (a lost lease): the handler did.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = db.Exec(ctx, `UPDATE model_key_runs SET ended_at = clock_timestamp() WHERE id = $1`, id) // unrecorded: the span ends at the lease
	}, nil
}

// setKeyLimits sets the model's limits per key, before any task.
func (m *model) setKeyLimits(ctx context.Context) {
	ctl, err := queuectl.New(m.s.admin, m.s.dq, m.s.ob.Config().Schema)
	if err != nil {
		m.s.t.Fatal(err)
	}
	for q, l := range keyLimits {
		if _, err := ctl.SetKeyLimits(ctx, q, l.cap, l.throttle, l.window); err != nil {
			m.s.t.Fatalf("key limits of %s: %v", q, err)
		}
	}
}

// opKeyed commits two to six tasks of one busy queue with concurrency keys, due
// now or soon, in one transaction: they contend for their keys' slots.
func (m *model) opKeyed(ctx context.Context) {
	q := m.queue()
	n := 2 + m.rng.IntN(5)
	var (
		news  []*mtask
		tasks []outbox.Task
	)
	for range n {
		m.nextID++
		t := &mtask{q: q, id: fmt.Sprintf("k%04d-%s", m.nextID, modelKeys[m.rng.IntN(len(modelKeys))])}
		d := time.Duration(m.rng.IntN(300)) * time.Millisecond
		if m.rng.IntN(5) == 0 {
			d, _ = m.delay()
		}
		news = append(news, t)
		tasks = append(tasks, outbox.Task{Queue: q, ID: t.id, Payload: modelPayload(1), Delay: d, MaxAttempts: 2 + m.rng.IntN(4),
			Priority: modelPriority(t.id), ConcurrencyKey: modelKeyOf(t.id)})
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := m.s.admin.Begin(ctx)
	if err != nil {
		m.s.t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after the commit
	res, err := m.s.ob.EnqueueMany(ctx, tx, tasks)
	if err != nil {
		m.s.t.Fatalf("enqueue keyed: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		m.s.t.Fatalf("commit keyed: %v", err)
	}
	for i, t := range news {
		m.tasks[t.key()] = t
		m.order = append(m.order, t)
		if res.Results[i].Duplicate {
			m.violation(t, "new keyed task reported a duplicate")
			continue
		}
		m.begin(t, tasks[i].MaxAttempts, res.Results[i].RunAt)
		m.logf(t, "enqueue keyed (%s) delay %v: run_at %s", modelKeyOf(t.id), tasks[i].Delay, stamp(res.Results[i].RunAt))
	}
}

// opReplace enqueues over a task the model holds open with a conflict policy.
func (m *model) opReplace(ctx context.Context) {
	ours := func(t *mtask) bool {
		return t.k == kOpen && (strings.HasPrefix(t.id, "m") || strings.HasPrefix(t.id, "k") || strings.HasPrefix(t.id, "h"))
	}
	// Mostly a task not yet due (replaced), else any (refused or a duplicate).
	soon := time.Now().Add(200 * time.Millisecond)
	t := m.pick(func(t *mtask) bool { return ours(t) && t.cur().runAt[t.version].After(soon) })
	if t == nil || m.rng.IntN(4) == 0 {
		t = m.pick(ours)
	}
	if t == nil {
		return
	}
	m.replace(ctx, t)
}

// opDebounceBurst enqueues a new task (keyed or not) with Debounce, then
// enqueues it again two to four times in a row, each a transaction: the
// pattern debounce is for. Its handler must run once, with the last payload.
func (m *model) opDebounceBurst(ctx context.Context) {
	m.nextID++
	t := &mtask{q: m.queue(), id: fmt.Sprintf("m%04d", m.nextID)}
	if m.rng.IntN(2) == 0 {
		t.id = fmt.Sprintf("k%04d-%s", m.nextID, modelKeys[m.rng.IntN(len(modelKeys))])
	}
	window := time.Duration(300+m.rng.IntN(700)) * time.Millisecond
	ma := 2 + m.rng.IntN(4)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := m.s.admin.Begin(ctx)
	if err != nil {
		m.s.t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after the commit
	payload := fmt.Sprintf("%s;r=%d", modelPayload(1), m.nextID)
	r, err := m.s.ob.Enqueue(ctx, tx, outbox.Task{Queue: t.q, ID: t.id, Payload: []byte(payload), MaxAttempts: ma,
		Priority: modelPriority(t.id), ConcurrencyKey: modelKeyOf(t.id), Debounce: window, MaxWait: 3 * window})
	if err != nil {
		m.s.t.Fatalf("debounce %s: %v", t.key(), err)
	}
	if err := tx.Commit(ctx); err != nil {
		m.s.t.Fatalf("commit: %v", err)
	}
	m.tasks[t.key()] = t
	m.order = append(m.order, t)
	if r.Duplicate || r.Debounced || r.Replaced {
		m.violation(t, "first debounced enqueue of a new id: %+v", r)
		return
	}
	m.begin(t, ma, r.RunAt)
	t.payload = payload
	m.logf(t, "enqueue with debounce %v (max wait %v): run_at %s", window, 3*window, stamp(r.RunAt))
	for range 2 + m.rng.IntN(3) {
		pause(ctx, time.Duration(m.rng.IntN(int(window/time.Millisecond)))*time.Millisecond)
		if t.k != kOpen {
			return
		}
		m.replace(ctx, t)
	}
}

// replace enqueues over t with Replace (maybe KeepRunAt) or Debounce (maybe
// with MaxWait).
func (m *model) replace(ctx context.Context, t *mtask) {
	m.nextID++
	payload := fmt.Sprintf("%s;r=%d", modelPayload(t.inc), m.nextID)
	nt := outbox.Task{Queue: t.q, ID: t.id, Payload: []byte(payload), MaxAttempts: t.cur().maxAttempts, ConcurrencyKey: modelKeyOf(t.id)}
	var what string
	if m.rng.IntN(2) == 0 {
		nt.Replace = true
		nt.KeepRunAt = m.rng.IntN(3) == 0
		if !nt.KeepRunAt {
			nt.Delay, _ = m.delay()
		}
		what = fmt.Sprintf("replace (keep run_at %v, delay %v)", nt.KeepRunAt, nt.Delay)
	} else {
		nt.Debounce = time.Duration(200+m.rng.IntN(800)) * time.Millisecond
		if m.rng.IntN(2) == 0 {
			nt.MaxWait = nt.Debounce + time.Duration(m.rng.IntN(1500))*time.Millisecond
		}
		what = fmt.Sprintf("debounce %v max wait %v", nt.Debounce, nt.MaxWait)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := m.s.admin.Begin(ctx)
	if err != nil {
		m.s.t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after the commit
	r, err := m.s.ob.Enqueue(ctx, tx, nt)
	var (
		st              string
		version, attemp int
		runAt           time.Time
	)
	if rerr := tx.QueryRow(ctx, `SELECT state, version, attempt, run_at FROM delayq_outbox WHERE queue = $1 AND task_id = $2`, t.q, t.id).Scan(&st, &version, &attemp, &runAt); rerr != nil && !errors.Is(rerr, pgx.ErrNoRows) {
		m.s.t.Fatalf("read %s after %s: %v", t.key(), what, rerr)
	}
	switch {
	case errors.Is(err, outbox.ErrRunning):
		m.ops["(replace refused: running)"]++
		m.logf(t, "%s: refused, running (%s, run_at %s)", what, st, stamp(runAt))
		if st != "queued" || runAt.After(time.Now()) {
			m.violation(t, "%s refused with ErrRunning, but the row is %s, due %s", what, st, stamp(runAt))
		}
		return
	case err != nil:
		m.s.t.Fatalf("%s %s: %v", what, t.key(), err)
	}
	cutAt := time.Now() // before the commit, as reschedule's
	if err := tx.Commit(ctx); err != nil {
		m.s.t.Fatalf("commit %s: %v", what, err)
	}
	switch {
	case r.Duplicate:
		m.ops["(replace of a finished task)"]++
		m.learn(t, what, st, "a duplicate: "+st)
		if !modelFinished(st) {
			m.violation(t, "%s reported a duplicate of a row %s", what, st)
		}
		return
	case !r.Replaced && !r.Debounced:
		m.violation(t, "%s of an existing task: neither replaced, debounced nor a duplicate: %+v", what, r)
		return
	}
	now := time.Now()
	if version != t.version+1 {
		m.violation(t, "%s made version %d, model expected %d", what, version, t.version+1)
	}
	inc := t.cur()
	inc.superseded[t.version] = now
	t.version = version
	inc.runAt[version] = runAt
	t.a0, t.since, t.flushed, t.payload = attemp, now, false, payload
	t.cuts = append(t.cuts, leaseCut{cutAt, t.inc, t.version})
	m.ops["(replaced)"]++
	m.logf(t, "%s: version %d, attempt %d, run_at %s, payload %q", what, version, attemp, stamp(runAt), payload)
}

// leaseCut is an operation that may end the lease of a run of incarnation inc
// at a version below below, at any time from at on (when the relay's replacing
// enqueue or the removal reaches Redis).
type leaseCut struct {
	at         time.Time
	inc, below int
}

// keyRun is one span of model_key_runs.
type keyRun struct {
	k                       key
	ckey, worker            string
	inc, version, attempt   int
	claimedAt, start, ended time.Time // ended zero: none recorded
}

// checkKeys checks the caps and throttles per key against the runs' spans.
func (m *model) checkKeys(ctx context.Context, v *violations) {
	rs, err := m.s.admin.Query(ctx, `SELECT queue, task_id, ckey, worker, inc, version, attempt, claimed_at, started_at, COALESCE(ended_at, 'epoch') FROM model_key_runs ORDER BY started_at`)
	if err != nil {
		m.s.t.Fatal(err)
	}
	var (
		r    keyRun
		runs = map[[2]string][]keyRun{} // by queue and key
	)
	if _, err := pgx.ForEachRow(rs, []any{&r.k.queue, &r.k.id, &r.ckey, &r.worker, &r.inc, &r.version, &r.attempt, &r.claimedAt, &r.start, &r.ended}, func() error {
		if r.ended.Unix() == 0 {
			r.ended = time.Time{}
		}
		runs[[2]string{r.k.queue, r.ckey}] = append(runs[[2]string{r.k.queue, r.ckey}], r)
		return nil
	}); err != nil {
		m.s.t.Fatal(err)
	}
	shards := max(m.s.shards, 1) // a cap and a throttle are per shard
	// lost reports whether a loss of Redis's data fell after claimed and by at.
	lost := func(claimed, at time.Time) bool {
		for _, l := range m.losses {
			if claimed.Before(l.to) && !at.Before(l.from) {
				return true
			}
		}
		return false
	}
	for qk, rs := range runs {
		lim := keyLimits[qk[0]]
		m.ops["(keyed runs)"] += len(rs)
		// The end of each run's slot, as far as the model can tell.
		end := make([]time.Time, len(rs))
		for i, r := range rs {
			e := r.claimedAt.Add(modelLease) // a killed worker's slot: until the reaper
			if !r.ended.IsZero() && r.ended.Before(e) {
				e = r.ended
			}
			// No end recorded, and a Postgres crash meanwhile: the run may have
			// failed on it (its retry gives the slot back), and the record of
			// its end with it (seed 5656886869360404070: two runs' ends lost
			// at a crash, their retries counted beside them).
			for _, c := range m.pgCrashes {
				if r.ended.IsZero() && c.to.After(r.start) && c.from.Before(e) {
					e = maxTime(r.start, c.from)
				}
			}
			if mt := m.tasks[r.k]; mt != nil {
				for _, c := range mt.cuts {
					// Also a cut committed before the claim: the run began
					// before the relay replaced its version in Redis (seed
					// 12522073149441357586: a replace of a task just due).
					if c.inc == r.inc && r.version < c.below && c.at.Before(e) {
						e = maxTime(r.start, c.at)
					}
				}
			}
			end[i] = e
		}
		for _, r := range rs {
			t := r.start
			var in []string
			for j, o := range rs {
				if !o.start.After(t) && end[j].After(t) && !lost(o.claimedAt, t) {
					in = append(in, fmt.Sprintf("%s v%d attempt %d by %s claimed %s, ran %s..%s", o.k, o.version, o.attempt, o.worker,
						stamp(o.claimedAt), stamp(o.start), stamp(end[j])))
				}
			}
			if len(in) >= lim.cap*shards {
				m.ops["(key at its cap)"]++ // the check is exercised: runs contend
			}
			if len(in) > lim.cap*shards {
				v.add("key-cap", "%s key %s (cap %d): %d runs at once at %s (%s started):\n      %s%s", qk[0], qk[1], lim.cap*shards, len(in), stamp(t), r.k,
					strings.Join(in, "\n      "), m.opsBetween(t.Add(-2*time.Second), t))
				break
			}
		}
		if lim.throttle == 0 {
			continue
		}
		// Starts: one per claim (a guard's re-run of a group starts no claim).
		var claims []keyRun
		seen := map[string]bool{}
		for _, r := range rs {
			if id := fmt.Sprint(r.k, r.version, r.attempt, r.claimedAt); !seen[id] {
				seen[id] = true
				claims = append(claims, r)
			}
		}
		slices.SortFunc(claims, func(a, b keyRun) int { return a.claimedAt.Compare(b.claimedAt) })
		for i, c := range claims {
			var in []string
			for _, o := range claims[i:] {
				if o.claimedAt.Sub(c.claimedAt) >= lim.window || lost(c.claimedAt, o.claimedAt) {
					break
				}
				in = append(in, fmt.Sprintf("%s v%d attempt %d claimed %s", o.k, o.version, o.attempt, stamp(o.claimedAt)))
			}
			if len(in) > lim.throttle*shards {
				v.add("key-throttle", "%s key %s (%d starts per %v): %d starts within %v of %s:\n      %s%s", qk[0], qk[1], lim.throttle*shards, lim.window,
					len(in), lim.window, stamp(c.claimedAt), strings.Join(in, "\n      "), m.opsBetween(c.claimedAt, c.claimedAt.Add(lim.window)))
				break
			}
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// checkPayloads checks the rows' payloads against the last one the model wrote
// (a replace or a debounce), and a done row's effect against its row's.
func (m *model) checkPayloads(ctx context.Context, v *violations) {
	rs, err := m.s.admin.Query(ctx, `SELECT o.queue, o.task_id, o.state, convert_from(o.payload, 'UTF8'), e.payload
		FROM delayq_outbox o LEFT JOIN model_effects e ON e.queue = o.queue AND e.task_id = o.task_id AND e.version = o.version AND o.state = 'done'
			AND split_part(e.payload, ';', 1) = split_part(convert_from(o.payload, 'UTF8'), ';', 1)`)
	if err != nil {
		m.s.t.Fatal(err)
	}
	var (
		k           key
		st, payload string
		effect      *string
	)
	if _, err := pgx.ForEachRow(rs, []any{&k.queue, &k.id, &st, &payload, &effect}, func() error {
		mt := m.tasks[k]
		if mt == nil || mt.payload == "" || mt.k == kGone {
			return nil
		}
		hist := "\n      history: " + strings.Join(mt.log, "\n               ")
		if payload != mt.payload {
			v.add("replace", "%s: row payload %q, the model last wrote %q%s", k, payload, mt.payload, hist)
		}
		if st == "done" && (effect == nil || *effect != payload) {
			v.add("replace", "%s: done with its row's payload %q, its effect ran with %v%s", k, payload, effect, hist)
		}
		return nil
	}); err != nil {
		m.s.t.Fatal(err)
	}
}
