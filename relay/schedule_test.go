package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
	"github.com/delayq/delayq/schedule"
)

// ticksAndState reads the ticks of schedule name in the outbox (tickRows) and the
// schedule's state (scheduleRow) in one snapshot: the relays go on ticking, and a
// tick's row and the state's count are committed together, so the two agree only
// when read together.
func (b testBundle) ticksAndState(t *testing.T, queue, name string) (ticks []time.Time, late []time.Duration, enqueued, missed int64) {
	t.Helper()
	tx, err := b.pool.BeginTx(ctxT(t), pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctxT(t)) //nolint:errcheck // read only
	ticks, late = tickRows(t, tx, queue, name)
	_, enqueued, missed = scheduleRow(t, tx, name)
	return ticks, late, enqueued, missed
}

// tickRows returns the tick times of schedule name in the outbox, in order, with
// how late each was enqueued (created_at - run_at, on the database clock).
func tickRows(t *testing.T, db outbox.Querier, queue, name string) (ticks []time.Time, late []time.Duration) {
	t.Helper()
	rows, err := db.Query(ctxT(t), `SELECT task_id, extract(epoch FROM created_at - run_at)::float8
FROM delayq_outbox WHERE queue = $1 AND task_id LIKE $2 ORDER BY task_id`, queue, name+"@%")
	if err != nil {
		t.Fatal(err)
	}
	var (
		id  string
		sec float64
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &sec}, func() error {
		n, at, ok := schedule.ParseTaskID(id)
		if !ok || n != name {
			return fmt.Errorf("task id %q is no tick of %s", id, name)
		}
		ticks = append(ticks, at)
		late = append(late, time.Duration(sec*float64(time.Second)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(ticks); i++ {
		if !ticks[i].After(ticks[i-1]) {
			t.Fatalf("tick ids out of time order: %v before %v", ticks[i-1], ticks[i])
		}
	}
	return ticks, late
}

// scheduleRow reads the state of schedule name.
func (b testBundle) scheduleRow(t *testing.T, name string) (last time.Time, enqueued, missed int64) {
	t.Helper()
	return scheduleRow(t, b.pool, name)
}

func scheduleRow(t *testing.T, db outbox.Querier, name string) (last time.Time, enqueued, missed int64) {
	t.Helper()
	err := db.QueryRow(ctxT(t), `SELECT last_tick, enqueued, missed FROM delayq_schedules WHERE name = $1`, name).
		Scan(&last, &enqueued, &missed)
	if err != nil && err != pgx.ErrNoRows {
		t.Fatal(err)
	}
	return last, enqueued, missed
}

// TestScheduleThreeRelaysExactlyOnce runs one 50 ms schedule on three relays and a
// transactional worker recording every run: the first 100 ticks are consecutive
// (none skipped), each has one outbox row and ran exactly once. The schedule state
// is then rewound while the relays run (as if it were lost): the ticks enqueued
// again are duplicates, and nothing runs twice.
func TestScheduleThreeRelaysExactlyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	const every = 50 * time.Millisecond
	// The default Grace (a minute): a tick counts as missed only after that long
	// without a round of any relay, which the loaded machine's pauses (over a
	// second with 8 tests a package) are not; none may be missed here.
	sch := schedule.Config{
		Lookahead: 200 * time.Millisecond,
		Schedules: []schedule.Schedule{{Name: "tick", Queue: "ticks", Every: every, Payload: []byte("p")}},
	}
	if _, err := b.pool.Exec(ctx, `CREATE TABLE runs (id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	w, err := clientkit.NewClient(b.pool, b.dq, b.ob, delayq.WorkerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	err = w.HandleTx("ticks", func(ctx context.Context, tx pgx.Tx, task *delayq.Task) error {
		_, err := tx.Exec(ctx, `INSERT INTO runs (id) VALUES ($1)`, task.ID)
		return err
	}, delayq.QueueConfig{Concurrency: 8})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(context.Background())
	wdone := make(chan error, 1)
	go func() { wdone <- w.Run(wctx) }()
	t.Cleanup(func() { stop(); <-wdone })
	for range 3 {
		b.start(t, relay.Config{Schedules: sch, PollInterval: time.Second})
	}

	const n = 100
	ran := func() int {
		var c int
		if err := b.pool.QueryRow(ctx, `SELECT count(DISTINCT id) FROM runs`).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	eventually(t, time.Minute, func() (bool, string) {
		c := ran()
		return c >= n, fmt.Sprintf("%d ticks ran, want %d", c, n)
	})
	// Rewind the state by a second, as if it were lost: 20 ticks are enqueued
	// again, and are duplicates.
	_, enqBefore, _ := b.scheduleRow(t, "tick")
	if _, err := b.pool.Exec(ctx, `UPDATE delayq_schedules SET last_tick = last_tick - interval '1 second' WHERE name = 'tick'`); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, func() (bool, string) {
		c := ran()
		return c >= n+40, fmt.Sprintf("%d ticks ran, want %d", c, n+40)
	})

	ticks, late, enq, missed := b.ticksAndState(t, "ticks", "tick")
	for i := 1; i < len(ticks); i++ {
		if d := ticks[i].Sub(ticks[i-1]); d != every {
			t.Fatalf("ticks %d and %d: %v and %v, %v apart, want %v", i-1, i, ticks[i-1], ticks[i], d, every)
		}
	}
	// Enqueued ahead of the tick normally; on a loaded machine a round may come
	// late (a timing, not a guarantee: logged, not checked).
	lateN := 0
	for _, l := range late {
		if l > 0 {
			lateN++
		}
	}
	// Every tick that fell due ran exactly once.
	var due, once, twice int
	err = b.pool.QueryRow(ctx, `SELECT
  (SELECT count(*) FROM delayq_outbox WHERE queue = 'ticks' AND state = 'done'),
  (SELECT count(*) FROM (SELECT id FROM runs GROUP BY id HAVING count(*) = 1) x),
  (SELECT count(*) FROM (SELECT id FROM runs GROUP BY id HAVING count(*) > 1) x)`).Scan(&due, &once, &twice)
	if err != nil {
		t.Fatal(err)
	}
	if twice != 0 || once != due || once < n+40 {
		t.Fatalf("%d ticks done, %d ran once, %d more than once; want every done tick once, at least %d", due, once, twice, n+40)
	}
	if int(enq) != len(ticks) || missed != 0 {
		t.Fatalf("schedule state: %d enqueued, %d missed; the outbox has %d ticks, none may be missed", enq, missed, len(ticks))
	}
	t.Logf("%d ticks on 3 relays, each once; %d enqueued before the rewind; %d enqueued after their time", len(ticks), enqBefore, lateN)
}

// TestScheduleMissedTicks stops the only relay of a 100 ms schedule for three
// seconds (30 ticks) and starts another, once per policy: skip enqueues none of
// the missed ticks, catch-up 3 the three most recent, each at once; the ticks
// after the outage follow without a gap.
func TestScheduleMissedTicks(t *testing.T) {
	t.Parallel()
	for _, pol := range []struct {
		missed  schedule.Missed
		catchUp int
	}{{schedule.Skip, 0}, {schedule.CatchUp, 3}} {
		t.Run(string(pol.missed), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := ctxT(t)
			const every = 100 * time.Millisecond
			grace := 500 * time.Millisecond
			cfg := relay.Config{Schedules: schedule.Config{
				Lookahead: 400 * time.Millisecond, Grace: grace,
				Schedules: []schedule.Schedule{{Name: "job", Queue: "jobs", Every: every, Missed: pol.missed, CatchUp: pol.catchUp}},
			}}
			// A relay runs the schedule for a few ticks, then stops.
			first := b.startStoppable(t, cfg)
			eventually(t, time.Minute, func() (bool, string) {
				_, enq, _ := b.scheduleRow(t, "job")
				return enq >= 5, fmt.Sprintf("%d ticks enqueued", enq)
			})
			first()
			lastBefore, enqBefore, _ := b.scheduleRow(t, "job")
			// Down for three seconds by the database clock.
			eventually(t, time.Minute, func() (bool, string) {
				var ok bool
				if err := b.pool.QueryRow(ctx, `SELECT now() > $1::timestamptz + interval '3 seconds'`, lastBefore).Scan(&ok); err != nil {
					t.Fatal(err)
				}
				return ok, "waiting for the outage to last 3s"
			})
			b.start(t, cfg)
			eventually(t, time.Minute, func() (bool, string) {
				_, enq, _ := b.scheduleRow(t, "job")
				return enq >= enqBefore+int64(pol.catchUp)+5, fmt.Sprintf("%d ticks enqueued", enq)
			})

			ticks, late, enq, missed := b.ticksAndState(t, "jobs", "job")
			if int(enq) != len(ticks) {
				t.Fatalf("%d ticks counted enqueued, %d in the outbox", enq, len(ticks))
			}
			// The ticks not enqueued are one block right after the last tick
			// before the outage, as many as counted missed; the caught-up ticks
			// (enqueued more than the grace late) come right after that block.
			var gap, caught []time.Time
			for i := 1; i < len(ticks); i++ {
				for at := ticks[i-1].Add(every); at.Before(ticks[i]); at = at.Add(every) {
					gap = append(gap, at)
				}
			}
			for i, l := range late {
				if l > grace {
					caught = append(caught, ticks[i])
				}
			}
			if len(gap) == 0 || int64(len(gap)) != missed {
				t.Fatalf("%d ticks missing from the outbox, %d counted missed; want the same, more than 0", len(gap), missed)
			}
			if !gap[0].Equal(lastBefore.Add(every)) {
				t.Fatalf("the missing ticks start at %v, want right after the last one before the outage (%v)", gap[0], lastBefore)
			}
			for i := 1; i < len(gap); i++ {
				if gap[i].Sub(gap[i-1]) != every {
					t.Fatalf("the missing ticks are not one block: %v", gap)
				}
			}
			if len(caught) != pol.catchUp {
				t.Fatalf("%d ticks enqueued late (caught up), want %d", len(caught), pol.catchUp)
			}
			for i, c := range caught {
				if want := gap[len(gap)-1].Add(time.Duration(i+1) * every); !c.Equal(want) {
					t.Fatalf("caught-up ticks %v, want the %d right after the missed ones (%v)", caught, pol.catchUp, gap)
				}
			}
			if len(gap)+pol.catchUp < 20 {
				t.Fatalf("only %d ticks fell in the 3 s outage", len(gap)+pol.catchUp)
			}
			t.Logf("policy %s: %d ticks missed, %d caught up, %d enqueued in all", pol.missed, len(gap), len(caught), len(ticks))
		})
	}
}

// startStoppable starts a relay and returns a function that stops it and waits
// for Run to return.
func (b testBundle) startStoppable(t *testing.T, cfg relay.Config) (stop func()) {
	t.Helper()
	cfg.Logger = testLogger(t)
	rl, err := relay.New(testenv.Pool(t, b.url), b.dq.AsRedis(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// TestScheduleConfigRejected: New refuses invalid schedules.
func TestScheduleConfigRejected(t *testing.T) {
	t.Parallel()
	for _, s := range []schedule.Schedule{
		{Name: "a", Queue: "q"},
		{Name: "a", Queue: "q", Every: time.Second, Cron: "* * * * *"},
		{Name: "a b", Queue: "q", Every: time.Second},
		{Name: "a", Queue: "q", Cron: "61 * * * *"},
		{Name: "a", Queue: "q", Cron: "* * * * *", TimeZone: "Mars/Olympus"},
		{Name: "a", Queue: "q", Every: time.Second, Missed: "later"},
	} {
		cfg := relay.Config{Schedules: schedule.Config{Schedules: []schedule.Schedule{s}}}
		if err := cfg.Validate(); err == nil {
			t.Errorf("%+v accepted", s)
		}
	}
}
