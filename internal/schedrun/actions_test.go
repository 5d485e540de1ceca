package schedrun

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/internal/schedspec"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/schedule"
)

type actionsBundle struct {
	pool *pgxpool.Pool
	ob   *outbox.Client
	act  *Actions
}

func setupActions(t *testing.T) actionsBundle {
	t.Helper()
	ob, err := outbox.New(outbox.Config{Schema: "public"})
	if err != nil {
		t.Fatal(err)
	}
	return actionsBundle{pool: testenv.Postgres(t), ob: ob, act: NewActions(ob)}
}

// ids lists the task ids of queue, by id.
func (b actionsBundle) ids(t *testing.T, queue string) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT task_id FROM delayq_outbox WHERE queue = $1 ORDER BY task_id`, queue)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPauseResume: two runners on a simulated clock with a schedule every
// minute whose missed ticks are caught up (five of them). Paused, neither
// enqueues a tick, and the ticks that fall are counted as missed; resumed, the
// ticks up to the resume stay missed (no catch-up of them) and the schedule goes
// on after it. Pausing twice, resuming a running schedule and an unknown name
// change nothing.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	b := setupActions(t)
	ctx := context.Background()
	s := schedule.Schedule{Name: "hb", Queue: "ops", Every: time.Minute, Payload: []byte(`{}`), Missed: schedule.CatchUp, CatchUp: 5}
	cfg := schedule.Config{Schedules: []schedule.Schedule{s}, Lookahead: 10 * time.Second, Grace: time.Minute}
	start := time.Date(2026, 12, 5, 1, 0, 30, 0, time.UTC)
	sim := start
	runners := make([]*Runner, 2)
	for i := range runners {
		r, err := New(cfg, b.ob, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.now = func() time.Time { return sim }
		runners[i] = r
	}
	round := func(r *Runner) result {
		t.Helper()
		res, err := r.runOnce(ctx, b.pool)
		if err != nil || len(res) != 1 {
			t.Fatalf("at %v: %v %v", sim, res, err)
		}
		return res[0]
	}
	// Running: the ticks of 01:01 .. 01:05.
	for ; !sim.After(start.Add(5 * time.Minute)); sim = sim.Add(time.Minute) {
		round(runners[0])
	}
	before := b.ids(t, "ops")
	if len(before) != 5 {
		t.Fatalf("ticks before the pause: %v", before)
	}

	if _, err := b.act.Pause(ctx, b.pool, "nope", nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("pause of an unknown schedule: %v", err)
	}
	ch, err := b.act.Pause(ctx, b.pool, "hb", nil)
	if err != nil || !ch.Changed || ch.At.IsZero() {
		t.Fatalf("pause: %+v %v", ch, err)
	}
	if ch2, err := b.act.Pause(ctx, b.pool, "hb", nil); err != nil || ch2.Changed || !ch2.At.Equal(ch.At) {
		t.Fatalf("pause again: %+v %v, want unchanged since %v", ch2, err, ch.At)
	}
	// Paused for ten minutes: every evaluation, by either runner, enqueues
	// nothing and counts the ticks that fell.
	for sim = start.Add(5*time.Minute + 30*time.Second); !sim.After(start.Add(14*time.Minute + 30*time.Second)); sim = sim.Add(30 * time.Second) {
		if res := round(runners[int(sim.Unix()/30)%2]); !res.Paused || res.Enqueued != 0 {
			t.Fatalf("at %v, paused: %+v", sim, res)
		}
	}
	if got := b.ids(t, "ops"); len(got) != len(before) {
		t.Fatalf("ticks enqueued while paused: %v", got)
	}
	states, err := List(ctx, b.pool, "public", nil)
	if err != nil || len(states) != 1 || !states[0].Paused || states[0].PausedAt == nil || states[0].Missed != 10 {
		// 01:06 .. 01:15 fell, counted by the last evaluation, at 01:15:00
		t.Fatalf("paused state: %+v %v", states, err)
	}

	// Resumed at 01:27:30 (no runner ran since 01:15:00); a runner back at
	// 01:30:30: the ticks of 01:16..01:27 fell while paused, those of 01:28 and
	// 01:29 with no runner. Only the latter are the missed-tick policy's (caught
	// up: up to five would be).
	if ch, err := b.act.Resume(ctx, b.pool, "hb"); err != nil || !ch.Changed {
		t.Fatalf("resume: %+v %v", ch, err)
	}
	if ch, err := b.act.Resume(ctx, b.pool, "hb"); err != nil || ch.Changed {
		t.Fatalf("resume again: %+v %v", ch, err)
	}
	// The database's clock stamped the resume; the test's simulated one runs
	// the runners.
	if _, err := b.pool.Exec(ctx, `UPDATE delayq_schedules SET resumed_at = $1`, start.Add(27*time.Minute)); err != nil {
		t.Fatal(err)
	}
	sim = start.Add(30 * time.Minute)
	res := round(runners[1])
	if res.Paused || res.Missed != 12 || res.Enqueued != 2+1 {
		// missed: 01:16..01:27, paused; enqueued: 01:28 and 01:29 caught up,
		// and 01:30.
		t.Fatalf("after the resume: %+v", res)
	}
	var want []string
	for m := 1; m <= 5; m++ {
		want = append(want, schedule.TaskID(s, start.Truncate(time.Minute).Add(time.Duration(m)*time.Minute)))
	}
	for m := 28; m <= 30; m++ {
		want = append(want, schedule.TaskID(s, start.Truncate(time.Minute).Add(time.Duration(m)*time.Minute)))
	}
	got := b.ids(t, "ops")
	if len(got) != len(want) {
		t.Fatalf("ticks = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("ticks = %v, want %v", got, want)
		}
	}
	states, _ = List(ctx, b.pool, "public", nil)
	if states[0].Paused || states[0].PausedAt != nil || states[0].Missed != 10+12 {
		t.Fatalf("resumed state: %+v", states[0])
	}
}

// TestPauseDeclaredNotRun: a schedule declared (a file's, a client's) and not
// run yet is registered paused; its first runner enqueues nothing.
func TestPauseDeclaredNotRun(t *testing.T) {
	t.Parallel()
	b := setupActions(t)
	ctx := context.Background()
	s := schedule.Schedule{Name: "soon", Queue: "ops", Every: time.Second, Payload: []byte(`{"k":1}`)}
	decl, err := Declare([]schedule.Schedule{s})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.act.Pause(ctx, b.pool, "other", decl); !errors.Is(err, ErrNotFound) {
		t.Fatalf("pause of a name not declared: %v", err)
	}
	if ch, err := b.act.Pause(ctx, b.pool, "soon", decl); err != nil || !ch.Changed {
		t.Fatalf("pause: %+v %v", ch, err)
	}
	r, err := New(schedule.Config{Schedules: []schedule.Schedule{s}}, b.ob, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.runOnce(ctx, b.pool)
	if err != nil || len(res) != 1 || !res[0].Paused || res[0].Enqueued != 0 {
		t.Fatalf("first evaluation of a paused schedule: %+v %v", res, err)
	}
	if got := b.ids(t, "ops"); len(got) != 0 {
		t.Fatalf("enqueued: %v", got)
	}
}

// TestRunNow: a manual run is one task, the schedule's, with an id that names
// the schedule and the run; the same key again enqueues nothing; the ticks'
// state is left as it is; an unknown name, a bad key and a schedule whose
// payload no runner wrote are refused, enqueuing nothing.
func TestRunNow(t *testing.T) {
	t.Parallel()
	b := setupActions(t)
	ctx := context.Background()
	s := schedule.Schedule{Name: "nightly", Queue: "reports", Cron: "0 3 * * *", TimeZone: "Europe/Paris", Payload: []byte(`{"kind":"nightly"}`), MaxAttempts: 3}
	r, err := New(schedule.Config{Schedules: []schedule.Schedule{s}}, b.ob, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.RunOnce(ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	var lastTick, nextTick time.Time
	read := func() (time.Time, time.Time) {
		var l, n time.Time
		if err := b.pool.QueryRow(ctx, `SELECT last_tick, next_tick FROM delayq_schedules WHERE name = 'nightly'`).Scan(&l, &n); err != nil {
			t.Fatal(err)
		}
		return l, n
	}
	lastTick, nextTick = read()

	asked := time.Now()
	key := schedspec.NewRunKey(asked)
	if _, err := b.act.RunNow(ctx, b.pool, "nope", key, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown schedule: %v", err)
	}
	if _, err := b.act.RunNow(ctx, b.pool, "nightly", "2026-x", nil); !errors.Is(err, ErrRunKey) {
		t.Fatalf("bad key: %v", err)
	}
	run, err := b.act.RunNow(ctx, b.pool, "nightly", key, nil)
	if err != nil || run.Duplicate || run.Queue != "reports" {
		t.Fatalf("run: %+v %v", run, err)
	}
	name, at, ok := schedule.ParseTaskID(run.ID)
	if !ok || name != "nightly" || !at.Equal(asked.UTC().Truncate(time.Second)) {
		t.Fatalf("ParseTaskID(%q) = %q %v %v", run.ID, name, at, ok)
	}
	again, err := b.act.RunNow(ctx, b.pool, "nightly", key, nil)
	if err != nil || !again.Duplicate || again.ID != run.ID {
		t.Fatalf("the same key again: %+v %v", again, err)
	}
	var payload []byte
	var maxAttempts int
	if err := b.pool.QueryRow(ctx, `SELECT payload, max_attempts FROM delayq_outbox WHERE queue = 'reports' AND task_id = $1`, run.ID).
		Scan(&payload, &maxAttempts); err != nil || string(payload) != `{"kind":"nightly"}` || maxAttempts != 3 {
		t.Fatalf("the run's task: %s %d %v", payload, maxAttempts, err)
	}
	if got := b.ids(t, "reports"); len(got) != 1 {
		t.Fatalf("tasks: %v, want the run's alone", got)
	}
	if l, n := read(); !l.Equal(lastTick) || !n.Equal(nextTick) {
		t.Fatalf("the run moved the ticks: last %v next %v, were %v %v", l, n, lastTick, nextTick)
	}
	states, err := List(ctx, b.pool, "public", nil)
	if err != nil || states[0].LastRunID != run.ID || states[0].LastRunAt == nil || states[0].Enqueued != 0 {
		t.Fatalf("state after the run: %+v %v", states, err)
	}

	// A row no runner of this version evaluated: no payload to run.
	if _, err := b.pool.Exec(ctx, `UPDATE delayq_schedules SET payload = NULL, max_attempts = NULL`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.act.RunNow(ctx, b.pool, "nightly", schedspec.NewRunKey(time.Now()), nil); !errors.Is(err, ErrNoPayload) {
		t.Fatalf("no payload: %v", err)
	}
	if got := b.ids(t, "reports"); len(got) != 1 {
		t.Fatalf("tasks: %v", got)
	}
	// Its declaration gives it; a declared schedule not run yet is registered.
	decl, err := Declare([]schedule.Schedule{{Name: "fresh", Queue: "reports", Every: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	if run, err := b.act.RunNow(ctx, b.pool, "fresh", schedspec.NewRunKey(time.Now()), decl); err != nil || run.Duplicate {
		t.Fatalf("run of a declared schedule: %+v %v", run, err)
	}
	if got := b.ids(t, "reports"); len(got) != 2 {
		t.Fatalf("tasks: %v", got)
	}
}
