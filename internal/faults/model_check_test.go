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

// modelRow is an outbox row as the model's checker reads it.
type modelRow struct {
	state            string
	version, attempt int
	runAt            time.Time
}

// modelRun is one handler run, from model_runs.
type modelRun struct {
	inc, version, attempt int
	outcome, worker       string
	due, claimedAt        time.Time
	startedAt             time.Time // when its handler recorded it (Postgres's clock)
}

// starved reports whether the run's handler started so long after its claim that
// its lease may have run out before it ended: on a loaded machine a process can
// stall that long, and the reaper then counts the attempt as lost. Its outcome
// is not the planned one, whatever the product does.
func (r modelRun) starved() bool { return r.startedAt.Sub(r.claimedAt) > modelLease/2 }

// modelEffect is one committed effect, from model_effects.
type modelEffect struct {
	inc, version, attempt int
	worker                string
}

// check waits for the system to settle once the operations stopped, then
// compares everything with the model.
func (m *model) check(ctx context.Context) {
	s, t := m.s, m.s.t
	opsEnd := time.Now()
	settled := s.settle(ctx, modelSettle)
	settleTime := time.Since(opsEnd)
	// A slow run whose lease was taken back may still be in its handler: it is
	// refused by the guard (every row is finished), but let it end before Redis is
	// read, and stop the processes so that nothing moves any more.
	pause(ctx, modelSlow)
	m.workers.stop()
	m.relays.stop()

	rows := map[key]modelRow{}
	rs, err := s.admin.Query(ctx, `SELECT queue, task_id, state, version, attempt, run_at FROM delayq_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	var (
		k key
		r modelRow
	)
	if _, err := pgx.ForEachRow(rs, []any{&k.queue, &k.id, &r.state, &r.version, &r.attempt, &r.runAt}, func() error {
		rows[k] = r
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	runs := map[key][]modelRun{}
	rs, err = s.admin.Query(ctx, `SELECT queue, task_id, inc, version, attempt, outcome, worker, due, claimed_at, started_at FROM model_runs ORDER BY claimed_at`)
	if err != nil {
		t.Fatal(err)
	}
	var ru modelRun
	if _, err := pgx.ForEachRow(rs, []any{&k.queue, &k.id, &ru.inc, &ru.version, &ru.attempt, &ru.outcome, &ru.worker, &ru.due, &ru.claimedAt, &ru.startedAt}, func() error {
		runs[k] = append(runs[k], ru)
		if ru.starved() {
			m.starvedAt = append(m.starvedAt, ru.claimedAt)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	effects := map[key][]modelEffect{}
	rs, err = s.admin.Query(ctx, `SELECT queue, task_id, inc, version, attempt, worker FROM model_effects`)
	if err != nil {
		t.Fatal(err)
	}
	var ef modelEffect
	if _, err := pgx.ForEachRow(rs, []any{&k.queue, &k.id, &ef.inc, &ef.version, &ef.attempt, &ef.worker}, func() error {
		effects[k] = append(effects[k], ef)
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	v := &violations{byCat: map[string][]string{}}
	for _, f := range m.faults {
		v.add("operation", "%s", f)
	}
	certain, nRuns, nEffects := 0, 0, 0
	for _, mt := range m.order {
		row, hasRow := rows[mt.key()]
		if m.checkTask(v, mt, row, hasRow, runs[mt.key()], effects[mt.key()]) {
			certain++
		}
		nRuns += len(runs[mt.key()])
		nEffects += len(effects[mt.key()])
	}
	for k := range m.rolled {
		if _, ok := rows[k]; ok {
			v.add("rolled-back", "%s: rolled back, but has a row", k)
		}
		if n := len(runs[k]) + len(effects[k]); n > 0 {
			v.add("rolled-back", "%s: rolled back, but %d runs and effects", k, n)
		}
	}
	for k := range rows {
		if m.tasks[k] == nil && m.wfTasks[k] == nil && m.batches[k] == nil {
			v.add("unknown", "%s: a row the model never committed", k)
		}
	}
	m.checkRedis(ctx, v, rows)
	m.checkWorkflows(ctx, v, rows, runs, effects)
	m.checkBatches(ctx, v, rows, runs, effects)
	m.checkKeys(ctx, v)
	m.checkPayloads(ctx, v)
	m.checkResults(ctx, v, effects)
	m.checkControls(v, runs)
	incs, err := reconcile.Check(ctx, s.admin, s.dq, reconcile.Options{Queues: modelQueues, Grace: -1})
	if err != nil {
		t.Errorf("reconcile.Check: %v", err)
	}
	for _, inc := range incs {
		v.add("reconcile-check", "%s %s/%s: postgres %q, redis %q", inc.Kind, inc.Queue, inc.ID, inc.Postgres, inc.Redis)
	}

	states := map[string]int{}
	for _, r := range rows {
		states[r.state]++
	}
	line := fmt.Sprintf("model: seed=%d tasks=%d rows=%v runs=%d effects=%d certain=%d ops=[%s] worker_kills=%d relay_kills=%d starved_runs=%d settle=%s violations=%d elapsed=%s",
		m.seed, len(m.order), states, nRuns, nEffects, certain, m.summary(), m.workers.kills.Load(), m.relays.kills.Load(), len(m.starvedAt),
		settleTime.Round(100*time.Millisecond), v.n, time.Since(s.started).Round(100*time.Millisecond))
	t.Log(line)
	fmt.Println(line)
	if v.n > 0 || !settled {
		t.Errorf("model: %d violations (settled=%v), seed %d:%s\n  operations (tail):\n    %s",
			v.n, settled, m.seed, v.String(), strings.Join(m.oplog[max(0, len(m.oplog)-40):], "\n    "))
	}
}

// checkTask compares one task's row, runs and effects with the model; it
// returns whether the model was certain of the final state.
func (m *model) checkTask(v *violations, mt *mtask, row modelRow, hasRow bool, runs []modelRun, effects []modelEffect) (certain bool) {
	hist := "\n      history: " + strings.Join(mt.log, "\n               ")
	for _, r := range runs {
		hist += fmt.Sprintf("\n      run: inc %d v%d attempt %d %s by %s, claimed %s, started %v after", r.inc, r.version, r.attempt,
			r.outcome, r.worker, stamp(r.claimedAt), r.startedAt.Sub(r.claimedAt).Round(time.Millisecond))
	}
	bad := func(cat, format string, args ...any) {
		v.add(cat, "%s: %s%s", mt.key(), fmt.Sprintf(format, args...), hist)
	}
	// Postgres equals the model where the model knows.
	switch mt.k {
	case kGone:
		if hasRow {
			bad("postgres", "row %s v%d, the model says it was deleted", row.state, row.version)
		}
	case kMaybeGone:
		if hasRow && !modelFinished(row.state) {
			bad("not-finished", "row %s v%d after the settle", row.state, row.version)
		}
		// Retention never deletes a dead row: a version planned to die is still there.
		if st, _, ok := m.expected(mt); !hasRow && ok && st == "dead" && !m.lostByKill(mt, runs) {
			bad("postgres", "no row, but its planned outcomes %s end dead, and retention keeps dead rows", m.planned(mt))
		}
	case kCancelled:
		if !hasRow || row.state != "cancelled" {
			bad("postgres", "cancelled, but row %v %+v", hasRow, row)
		}
	case kDone, kDead, kOpen:
		want := map[know]string{kDone: "done", kDead: "dead"}[mt.k]
		switch {
		case !hasRow:
			bad("postgres", "no row, the model holds it %s", mt.k)
		case !modelFinished(row.state):
			bad("not-finished", "row %s v%d attempt %d after the settle (committed, not cancelled)", row.state, row.version, row.attempt)
		case want != "" && row.state != want:
			bad("postgres", "row %s, the model knows it %s", row.state, want)
		}
	}
	if hasRow && mt.k != kGone && row.version != mt.version {
		bad("postgres", "row version %d, model %d", row.version, mt.version)
	}
	if hasRow && (mt.k == kOpen || mt.k == kMaybeGone || mt.k == kDone || mt.k == kDead) {
		st, attempt, ok := m.expected(mt)
		if ok && (m.lostByKill(mt, runs) || m.crashedDuring(mt, runs) || m.lostToStarvation(mt, runs)) {
			ok = false // a worker kill, a Postgres crash or a stalled process may have changed a run's outcome
		}
		if ok {
			certain = true
			if row.state != st || row.attempt != attempt {
				bad("postgres", "row %s attempt %d (v%d), the model expects %s attempt %d from the planned outcomes %s",
					row.state, row.attempt, row.version, st, attempt, m.planned(mt))
			}
		}
	}

	// At most one effect per incarnation; the current one has one exactly when
	// its row is done, of the row's version.
	perInc := map[int][]modelEffect{}
	for _, e := range effects {
		perInc[e.inc] = append(perInc[e.inc], e)
	}
	for inc, es := range perInc {
		if len(es) > 1 {
			bad("duplicate-effect", "incarnation %d: %d effects: %+v", inc, len(es), es)
		}
		if mt.incs[inc] == nil {
			bad("effect", "effect of incarnation %d that was never committed", inc)
		}
	}
	if hasRow && mt.k != kGone {
		es := perInc[mt.inc]
		switch {
		case row.state == "done" && len(es) != 1:
			bad("effect", "done with %d effects", len(es))
		case row.state == "done" && es[0].version != row.version:
			bad("effect", "done at version %d with the effect of version %d", row.version, es[0].version)
		case row.state != "done" && len(es) > 0:
			bad("effect", "%s with %d effects: %+v", row.state, len(es), es)
		}
	}

	// No run before its due time (Redis's, and the producer's run_at of its
	// version), no run of an incarnation or version that never existed, and no
	// older version started once the relay had time to replace it.
	for _, r := range runs {
		inc := mt.incs[r.inc]
		if inc == nil {
			bad("run", "run of incarnation %d that was never committed: %+v", r.inc, r)
			continue
		}
		runAt, ok := inc.runAt[r.version]
		if !ok {
			bad("run", "run of version %d that never existed (incarnation %d): %+v", r.version, r.inc, r)
			continue
		}
		switch {
		case r.claimedAt.Before(r.due):
			bad("early", "v%d attempt %d claimed at %s, due %s in Redis", r.version, r.attempt, stamp(r.claimedAt), stamp(r.due))
		case r.claimedAt.Before(time.UnixMilli(runAt.UnixMilli())):
			bad("early", "v%d attempt %d claimed at %s, its version was due at %s", r.version, r.attempt, stamp(r.claimedAt), stamp(runAt))
		}
		if sup, ok := inc.superseded[r.version]; ok && r.claimedAt.After(sup.Add(modelStaleWait)) {
			bad("stale-run", "v%d attempt %d (%s) claimed at %s, %v after version %d committed",
				r.version, r.attempt, r.outcome, stamp(r.claimedAt), r.claimedAt.Sub(sup).Round(time.Millisecond), r.version+1)
		}
	}
	// A retry waits its delay, also across a Redis flush and reconcile (the
	// failure writes its next run time to Postgres): attempt a+1 of a version is
	// claimed no sooner than the latest run of attempt a claimed before it plus
	// the least delay its outcome asks for (RetryAfter's, or the backoff's lower
	// bound). Attempt numbers may rewind: a claim whose worker died is counted in
	// Redis alone (a lost lease is not a recorded failure), so a Redis rebuilt
	// from Postgres counts again from the last recorded failure, and attempt a can
	// run again after attempt a+1 did. Hence the latest earlier run, not the first.
	type va struct{ inc, version, attempt int }
	latest := map[va]modelRun{}
	for _, r := range runs { // in claim order
		prev, ok := latest[va{r.inc, r.version, r.attempt - 1}]
		latest[va{r.inc, r.version, r.attempt}] = r
		if !ok {
			continue
		}
		var least time.Duration
		switch o, d := plan(m.seed, mt.q, mt.id, prev.inc, prev.version, prev.attempt); o {
		case oRetryAfter:
			least = d
		case oError, oPanic:
			least, _ = modelQueueConfig("").Backoff.Bounds(prev.attempt)
		default:
			continue // success, no-retry, slow: a next attempt comes from a lost lease
		}
		if r.claimedAt.Before(prev.claimedAt.Add(least)) {
			bad("backoff", "v%d attempt %d claimed at %s, %v after attempt %d (%s) was claimed; its retry delay is at least %v",
				r.version, r.attempt, stamp(r.claimedAt), r.claimedAt.Sub(prev.claimedAt).Round(time.Millisecond),
				prev.attempt, prev.outcome, least)
		}
	}
	return certain
}

// crashedDuring reports whether a run of mt's current version was claimed while
// a Postgres crash could fail it: from a slow handler's length before the crash
// to the end of the uncertain time after the restart. Such a run is recorded,
// but its transaction, or the record of its failure, may have died with the
// server (seed 7245670694199011382: a run planned to succeed was recorded as a
// failure, its last attempt, and the task went dead).
//
// A run may also fail before its handler records it: on a connection the crash
// broke (the worker's, or the model's own for the record). Its attempt is lost
// with no run to show: when the recorded runs skip an attempt, or there are
// none, a crash since the version began makes the end uncertain too (seed
// 5937432869212091421: a reschedule 4 ms after a restart, both attempts lost
// unrecorded, the task dead).
func (m *model) crashedDuring(mt *mtask, runs []modelRun) bool {
	last, recorded := mt.since, false
	for _, c := range m.pgCrashes {
		for _, r := range runs {
			if r.inc == mt.inc && r.version == mt.version &&
				r.claimedAt.After(c.from.Add(-modelSlow)) && r.claimedAt.Before(c.to) {
				return true
			}
		}
	}
	for _, r := range runs {
		if r.inc == mt.inc && r.version == mt.version {
			last, recorded = r.claimedAt, true
		}
	}
	if recorded && cleanRuns(mt, runs) {
		return false
	}
	if !recorded {
		last = time.Now()
	}
	for _, c := range m.pgCrashes {
		if c.to.After(mt.since.Add(-modelSlow)) && c.from.Before(last) {
			return true
		}
	}
	return false
}

// lostToStarvation reports whether a stalled process may have lost a run of mt's
// current version to its lease: one of its runs started late (starved), or an
// attempt has no run (a claim whose lease ran out before its handler began)
// while some run of the model started late within a slow handler's length of
// this task's claims. (Seed 7384211481351235695, on a machine at load 15-20: two
// attempts planned to succeed were counted lost, and the third, planned to
// fail, made the task dead.)
func (m *model) lostToStarvation(mt *mtask, runs []modelRun) bool {
	var first, last time.Time
	for _, r := range runs {
		if r.inc != mt.inc || r.version != mt.version {
			continue
		}
		if r.starved() {
			return true
		}
		if first.IsZero() {
			first = r.claimedAt
		}
		last = r.claimedAt
	}
	if cleanRuns(mt, runs) {
		return false
	}
	if first.IsZero() {
		first, last = mt.since, time.Now()
	}
	for _, at := range m.starvedAt {
		if at.After(first.Add(-modelSlow)) && at.Before(last.Add(modelSlow)) {
			return true
		}
	}
	return false
}

// killedSince reports whether a worker was killed since t.
func (m *model) killedSince(t time.Time) bool {
	return len(m.kills) > 0 && !m.kills[len(m.kills)-1].Before(t)
}

// cleanRuns reports whether the recorded runs of mt's current version are the
// attempts a0+1, a0+2, ... in order, each once: no run was lost.
// lostByKill reports whether a worker kill may have lost the outcome of a run of
// t's current version: a kill since, and runs that skip an attempt (a claim lost
// with its worker) or that ran in a group (whose failures and completion wait
// for the group's commit, so a recorded run's outcome may die with its process).
func (m *model) lostByKill(mt *mtask, runs []modelRun) bool {
	if !m.killedSince(mt.since) {
		return false
	}
	for _, r := range runs {
		if r.inc == mt.inc && r.version == mt.version && strings.HasPrefix(r.worker, modelGroupWorker) {
			return true
		}
		// A kill while the run was in its handler: the run was recorded (outside
		// its transaction), its outcome died with the worker, and on the last
		// attempt the reaper records it dead (seed 12023376130466414121).
		if r.inc == mt.inc && r.version == mt.version {
			for _, k := range m.kills {
				if !k.Before(r.claimedAt) && k.Before(r.claimedAt.Add(modelSlow)) {
					return true
				}
			}
		}
	}
	return !cleanRuns(mt, runs)
}

func cleanRuns(mt *mtask, runs []modelRun) bool {
	next := mt.a0 + 1
	for _, r := range runs { // in claim order
		if r.inc != mt.inc || r.version != mt.version {
			continue
		}
		if r.attempt != next {
			return false
		}
		next++
	}
	return true
}

// planned lists the planned outcomes of t's current version from a0+1.
func (m *model) planned(t *mtask) string {
	var parts []string
	for a := t.a0 + 1; a <= max(t.cur().maxAttempts, t.a0+1); a++ {
		o, _ := plan(m.seed, t.q, t.id, t.inc, t.version, a)
		parts = append(parts, fmt.Sprintf("%d:%s", a, o))
	}
	return fmt.Sprintf("[%s] (max %d)", strings.Join(parts, " "), t.cur().maxAttempts)
}

// checkRedis lists every key under the prefix: once idle, only dead tasks may
// keep anything (their hash and their member of the dead set); a dead task
// whose version was not flushed from Redis must still be there.
func (m *model) checkRedis(ctx context.Context, v *violations, rows map[key]modelRow) {
	s := m.s
	var keys []string
	iter := s.rdb.Scan(ctx, 0, modelPrefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		s.t.Fatalf("scan: %v", err)
	}
	slices.Sort(keys)
	type queueKeys struct {
		q string
		dispatch.Keys
	}
	var byQueue []queueKeys // every shard of every queue
	for _, q := range modelQueues {
		n, err := s.dq.Shards(ctx, q)
		if err != nil {
			s.t.Fatal(err)
		}
		for k := range n {
			kk, err := dispatch.ShardKeys(s.prefix, q, k, n)
			if err != nil {
				s.t.Fatal(err)
			}
			byQueue = append(byQueue, queueKeys{q, kk})
		}
	}
	// What the sharded queue's other layouts may keep (opReshard): a change of
	// count writes the new count into the old layout's controls too, so that an
	// enqueue routed by the old count is refused there, and its minutes of
	// history expire by themselves. Nothing else: a task, a ready or an active
	// set there would be misplaced.
	var otherLayouts []dispatch.Keys
	if n, err := s.dq.Shards(ctx, modelShardQueue); err == nil {
		for other := 1; other <= 4; other++ {
			for k := range other {
				if kk, err := dispatch.ShardKeys(s.prefix, modelShardQueue, k, other); err != nil {
					s.t.Fatal(err)
				} else if other != n {
					otherLayouts = append(otherLayouts, kk)
				}
			}
		}
	}
	oldLayout := func(rk string) bool {
		for _, kk := range otherLayouts {
			if rk == kk.Control || strings.HasPrefix(rk, kk.History) {
				return true
			}
		}
		return false
	}
	seen := map[key]bool{}
	for _, rk := range keys {
		known := oldLayout(rk)
		if rk == modelPrefix+":epoch" || strings.HasPrefix(rk, modelPrefix+":{e") && strings.HasSuffix(rk, "}:epoch") {
			continue // the mark of Redis data loss: one per server, not per task
		}
		if rk == modelPrefix+":queues" { // the registry of queues (a set of names)
			known = true
			members, err := s.rdb.SMembers(ctx, rk).Result()
			if err != nil {
				s.t.Fatal(err)
			}
			for _, q := range members {
				if !slices.Contains(modelQueues, q) {
					v.add("redis", "%s lists queue %q", rk, q)
				}
			}
		}
		if strings.HasPrefix(rk, modelPrefix+":{:workers}:") {
			// The worker processes' registry: the index, and a record per process
			// that expires (a killed worker never said goodbye).
			known = true
			if strings.HasPrefix(rk, modelPrefix+":{:workers}:p:") {
				if ttl, _ := s.rdb.PTTL(ctx, rk).Result(); ttl <= 0 {
					v.add("redis", "%s, a worker process's record, has no expiry (%v)", rk, ttl)
				}
			}
		}
		for _, kk := range byQueue {
			q := kk.q
			switch {
			case rk == kk.Control:
				known = true // the queue's controls (a shard count), mirrored from Postgres
			case rk == kk.Ready || rk == kk.Active:
				known = true
				n, _ := s.rdb.ZCard(ctx, rk).Result()
				v.add("redis", "%s holds %d members once idle", rk, n)
			case rk == kk.Dead:
				known = true
				members, err := s.rdb.ZRange(ctx, rk, 0, -1).Result()
				if err != nil {
					s.t.Fatal(err)
				}
				for _, id := range members {
					if r, ok := rows[key{q, id}]; !ok || r.state != "dead" {
						v.add("redis", "%s/%s in the dead set; Postgres: row %v %s", q, id, ok, r.state)
					}
				}
			case strings.HasPrefix(rk, kk.History):
				known = true // a minute of the queue's history: counts, not tasks; it expires
			case rk == kk.KeyPrefix+"n":
				// The count of a fair queue's parked tasks: a counter, left at 0
				// once none is parked (stats reads it); any other value is drift.
				known = true
				if n, err := s.rdb.Get(ctx, rk).Int(); err != nil || n != 0 {
					v.add("redis", "%s counts %d parked tasks once idle (%v)", rk, n, err)
				}
			case strings.HasPrefix(rk, kk.TaskPrefix):
				known = true
				id := strings.TrimPrefix(rk, kk.TaskPrefix)
				seen[key{q, id}] = true
				r, ok := rows[key{q, id}]
				infos, err := s.dq.Inspect(ctx, q, id)
				if err != nil {
					s.t.Fatal(err)
				}
				ti := infos[0]
				if !ok || r.state != "dead" || ti.State != dispatch.StateDead || ti.Version != r.version {
					ttl, _ := s.rdb.PTTL(ctx, rk).Result()
					msg := fmt.Sprintf("%s left in Redis: %s v%d attempt %d ttl %v; Postgres: row %v %s v%d",
						rk, ti.State, ti.Version, ti.Attempt, ttl, ok, r.state, r.version)
					if mt := m.tasks[key{q, id}]; mt != nil {
						msg += "\n      history: " + strings.Join(mt.log, "\n               ")
					}
					v.add("redis", "%s", msg)
				}
			}
		}
		if !known {
			v.add("redis", "unexpected key %s", rk)
		}
	}
	for k, r := range rows {
		if r.state != "dead" || seen[k] {
			continue
		}
		if mt := m.tasks[k]; mt != nil && !mt.flushed {
			v.add("redis", "%s: dead in Postgres (v%d), no record in Redis, and Redis was not flushed since%s",
				k, r.version, "\n      history: "+strings.Join(mt.log, "\n               "))
		}
	}
}

// violations collects what the checker found, by category.
type violations struct {
	n     int
	byCat map[string][]string
}

func (v *violations) add(cat, format string, args ...any) {
	v.n++
	if len(v.byCat[cat]) < 6 {
		v.byCat[cat] = append(v.byCat[cat], fmt.Sprintf(format, args...))
	}
}

func (v *violations) String() string {
	cats := make([]string, 0, len(v.byCat))
	for c := range v.byCat {
		cats = append(cats, c)
	}
	slices.Sort(cats)
	var b strings.Builder
	for _, c := range cats {
		fmt.Fprintf(&b, "\n  %s:\n    %s", c, strings.Join(v.byCat[c], "\n    "))
	}
	return b.String()
}

// modelFinished tells a row a run finished: done, dead, or cancelled by its
// handler (run-cancel).
func modelFinished(state string) bool {
	return state == "done" || state == "dead" || state == "cancelled"
}
