package reconcile

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/dispatch"
)

func TestDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	old := float64(b.redisNow(t).Add(-time.Hour).UnixMilli()) / 1000
	b.insertRows(t,
		pgRow{queue: "q", id: "d1", state: stateDead, attempt: 5, lastError: "boom 1", version: 2},
		pgRow{queue: "q", id: "d2", state: stateDead, attempt: 5, lastError: "boom 2"},
		pgRow{queue: "q", id: "d3", state: stateDead, attempt: 3, lastError: "boom 3"},
		pgRow{queue: "r", id: "d4", state: stateDead, attempt: 1, lastError: "boom 4"},
		pgRow{queue: "q", id: "alive", state: stateQueued},
	)
	b.putRedis(t,
		redisTask{queue: "q", id: "d1", status: "x", version: 2, attempt: 5, sets: map[string]float64{"dead": old}},
		redisTask{queue: "q", id: "d2", status: "x", attempt: 5, sets: map[string]float64{"dead": old}},
		// d3: Redis lost it. d4: only Postgres ever had it dead.
		redisTask{queue: "q", id: "alive", status: "r", sets: map[string]float64{"ready": old}},
	)

	all, err := ListDead(ctx, b.pool, Options{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 4 {
		t.Fatalf("ListDead: %+v", all)
	}
	qOnly, err := ListDead(ctx, b.pool, Options{Queues: []string{"q"}}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(qOnly) != 2 || qOnly[0].Queue != "q" || qOnly[0].LastError == "" || qOnly[0].DiedAt.IsZero() || qOnly[0].Attempts == 0 {
		t.Errorf("ListDead(q, 2): %+v", qOnly)
	}

	// Retry one: a new version, pending with attempt 0, in Postgres only (Postgres
	// commits first); the relay's move replaces the dead copy in Redis.
	if err := RetryDead(ctx, b.pool, Options{}, "q", "d1"); err != nil {
		t.Fatal(err)
	}
	if st, att, ver := b.state(t, "q", "d1"); st != statePending || att != 0 || ver != 3 {
		t.Errorf("d1 in Postgres: %s attempt %d v%d, want pending attempt 0 v3", st, att, ver)
	}
	if p := b.probe(t, "q", "d1"); p.State != dispatch.StateDead || p.Version != 2 {
		t.Errorf("d1 in Redis before the relay: %+v, want the dead copy of v2 untouched", p)
	}
	if _, err := b.relayOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if p := b.probe(t, "q", "d1"); p.State != dispatch.StateReady || p.Attempt != 0 || p.Version != 3 || !p.Consistent() ||
		p.ReadyScore.After(b.redisNow(t)) {
		t.Errorf("d1 in Redis after the relay: %+v, want ready now at v3", p)
	}
	for _, c := range []struct {
		q, id string
		want  error
	}{{"q", "d1", ErrNotDead}, {"q", "alive", ErrNotDead}, {"q", "nope", ErrNotFound}, {"q", "a{b", dispatch.ErrInvalidTaskID}} {
		if err := RetryDead(ctx, b.pool, Options{}, c.q, c.id); !errors.Is(err, c.want) {
			t.Errorf("RetryDead(%s/%s): %v, want %v", c.q, c.id, err, c.want)
		}
	}

	// Retry the rest of q (d3 has no Redis task: it gets one).
	n, err := RetryAllDead(ctx, b.pool, Options{Queues: []string{"q"}, BatchSize: 1})
	if err != nil || n != 2 {
		t.Fatalf("RetryAllDead: %d, %v", n, err)
	}
	r := newRuns()
	b.drain(t, ctx, []string{"q", "r"}, r)
	if got := r.snapshot(); len(got) != 4 || got["q/d1"] != 1 || got["q/d2"] != 1 || got["q/d3"] != 1 || got["q/alive"] != 1 {
		t.Errorf("runs after retry: %v", got)
	}
	if r.attempt["q/d3"] != 1 {
		t.Errorf("d3 ran as attempt %d, want 1", r.attempt["q/d3"])
	}
	if incs, err := Check(ctx, b.pool, b.dq, Options{}); err != nil || len(incs) != 0 {
		t.Errorf("check after retries: %v %+v", err, incs)
	}

	// Purge: r's dead task goes from both stores; done tasks stay.
	b.putRedis(t, redisTask{queue: "r", id: "d4", status: "x", sets: map[string]float64{"dead": old}})
	if err := PurgeDeadTask(ctx, b.pool, b.dq, Options{}, "q", "d1"); !errors.Is(err, ErrNotDead) {
		t.Errorf("PurgeDeadTask of a done task: %v", err)
	}
	n, err = PurgeDead(ctx, b.pool, b.dq, Options{})
	if err != nil || n != 1 {
		t.Fatalf("PurgeDead: %d, %v", n, err)
	}
	if p := b.probe(t, "r", "d4"); p.State != dispatch.StateMissing || !p.Consistent() {
		t.Errorf("d4 still in Redis: %+v", p)
	}
	if left, err := ListDead(ctx, b.pool, Options{}, 10); err != nil || len(left) != 0 {
		t.Errorf("dead after purge: %+v %v", left, err)
	}
	if st, _, _ := b.state(t, "q", "d2"); st != stateDone {
		t.Errorf("d2 is %s", st)
	}
}

func TestPurgeDeadTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	var rows []pgRow
	for i := range 5 {
		rows = append(rows, pgRow{queue: "q", id: fmt.Sprintf("d%d", i), state: stateDead})
	}
	b.insertRows(t, rows...)
	if err := PurgeDeadTask(ctx, b.pool, b.dq, Options{}, "q", "d3"); err != nil {
		t.Fatal(err)
	}
	if err := PurgeDeadTask(ctx, b.pool, b.dq, Options{}, "q", "d3"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second purge: %v", err)
	}
	left, err := ListDead(ctx, b.pool, Options{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range left {
		ids = append(ids, d.ID)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"d0", "d1", "d2", "d4"}) {
		t.Errorf("left %v", ids)
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	now := b.redisNow(t)
	b.insertRows(t,
		pgRow{queue: "q", id: "p1", state: statePending, runAt: now.Add(-90 * time.Second)},
		pgRow{queue: "q", id: "p2", state: statePending, runAt: now.Add(time.Hour)},
		pgRow{queue: "q", id: "q1", state: stateQueued},
		pgRow{queue: "q", id: "q2", state: stateQueued},
		pgRow{queue: "q", id: "x1", state: stateDead},
		pgRow{queue: "other", id: "c1", state: stateCancelled},
	)
	sec := func(d time.Duration) float64 { return float64(now.Add(d).UnixMilli()) / 1000 }
	b.putRedis(t,
		redisTask{queue: "q", id: "q1", status: "r", sets: map[string]float64{"ready": sec(-30 * time.Second)}},
		redisTask{queue: "q", id: "q2", status: "a", sets: map[string]float64{"active": sec(-time.Second)}},
		redisTask{queue: "q", id: "x1", status: "x", sets: map[string]float64{"dead": sec(-time.Hour)}},
		redisTask{queue: "q", id: "later", status: "r", sets: map[string]float64{"ready": sec(time.Hour)}},
		redisTask{queue: "q", id: "overdue", status: "r", sets: map[string]float64{"ready": sec(-2 * time.Minute)}},
	)
	st, err := Stats(ctx, b.pool, b.dq, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 2 || st[0].Queue != "other" || st[1].Queue != "q" {
		t.Fatalf("stats %+v", st)
	}
	o, q := st[0], st[1]
	if o.Postgres[stateCancelled] != 1 || o.Postgres[statePending] != 0 || len(o.Postgres) != len(delayqtype.States()) || o.Ready != 0 {
		t.Errorf("other: %+v", o)
	}
	if q.Postgres[statePending] != 2 || q.Postgres[stateQueued] != 2 || q.Postgres[stateDead] != 1 ||
		q.Ready != 3 || q.DueNow != 2 || q.Active != 1 || q.ExpiredLeases != 1 || q.Dead != 1 || q.Overdue != 1 {
		t.Errorf("q: %+v", q)
	}
	if q.OldestPendingAge < 85*time.Second || q.OldestPendingAge > 2*time.Minute {
		t.Errorf("oldest pending age %v, want about 90s", q.OldestPendingAge)
	}
	if q.OldestDueLateness < 119*time.Second || q.OldestDueLateness > 3*time.Minute {
		t.Errorf("oldest due lateness %v, want about 2m", q.OldestDueLateness)
	}
	one, err := Stats(ctx, b.pool, b.dq, Options{Queues: []string{"q"}})
	if err != nil || len(one) != 1 || one[0].Postgres[statePending] != 2 {
		t.Errorf("Stats(q): %+v %v", one, err)
	}
}

// One dead row Redis could never hold (a queue name or an id written by hand, or by
// an older version) does not block the dead-letter tools for its batch: retry and
// purge go on past it, and the valid rows are handled.
func TestDeadLettersGoPastBadRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t, time.Minute)
	rows := []pgRow{
		{queue: "bad queue", id: "a", state: stateDead},
		{queue: "q", id: "b", state: stateDead},
		{queue: "q", id: "c{1}", state: stateDead},
		{queue: "q", id: "d", state: stateDead},
	}
	b.insertRows(t, rows...)
	old := float64(b.redisNow(t).Add(-time.Hour).UnixMilli()) / 1000
	b.putRedis(t, redisTask{queue: "q", id: "d", status: "x", sets: map[string]float64{"dead": old}})

	n, err := RetryAllDead(ctx, b.pool, Options{BatchSize: 10})
	if err != nil || n != 4 {
		t.Fatalf("RetryAllDead: %d, %v; want all 4 retried", n, err)
	}
	for _, r := range rows {
		if st, _, ver := b.state(t, r.queue, r.id); st != statePending || ver != 2 {
			t.Errorf("%s/%s after retry: %s v%d, want pending v2", r.queue, r.id, st, ver)
		}
	}

	if _, err := b.pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET state = 'dead', done_at = now()`, b.table)); err != nil {
		t.Fatal(err)
	}
	n, err = PurgeDead(ctx, b.pool, b.dq, Options{BatchSize: 10})
	if err != nil || n != 4 {
		t.Fatalf("PurgeDead: %d, %v; want all 4 purged", n, err)
	}
	if left, err := ListDead(ctx, b.pool, Options{}, 10); err != nil || len(left) != 0 {
		t.Errorf("dead after purge: %+v %v", left, err)
	}
	if p := b.probe(t, "q", "d"); p.State != dispatch.StateMissing || !p.Consistent() {
		t.Errorf("q/d still in Redis: %+v", p)
	}
}
