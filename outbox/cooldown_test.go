package outbox_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

// notifications reads conn's notifications up to the marker, which the caller
// sent after everything it wants counted (notifications arrive in commit order),
// and returns them.
func notifications(t *testing.T, pool *pgxpool.Pool, conn *pgx.Conn) []string {
	t.Helper()
	marker(t, pool, "marker")
	var got []string
	for {
		p := nextNotification(t, conn)
		if p == "marker" {
			return got
		}
		got = append(got, p)
	}
}

// enqueueNow enqueues a task due now through q, committed by itself when q is a pool,
// and returns how long the call took.
func enqueueNow(t *testing.T, c *outbox.Client, q outbox.Querier, queue, id string) time.Duration {
	t.Helper()
	t0 := time.Now()
	if res, err := c.Enqueue(t.Context(), q, outbox.Task{Queue: queue, ID: id}); err != nil || res.Duplicate {
		t.Fatalf("Enqueue %s/%s: %+v, %v", queue, id, res, err)
	}
	return time.Since(t0)
}

// lateAfter is when the commit of an enqueue that left its notification out
// notifies after all (migration 00015): a committed enqueue that took less, from
// its transaction's start, certainly did not. A loaded machine makes even a lone
// statement take that long now and then.
const lateAfter = 25 * time.Millisecond

// lateCommits counts the durations of lateAfter or more.
func lateCommits(ds ...time.Duration) int {
	n := 0
	for _, d := range ds {
		if d >= lateAfter {
			n++
		}
	}
	return n
}

// equalBut reports whether got is want with at most extra notifications more, each
// a repeat of the one before it (a late commit's, which follows its queue's).
func equalBut(got, want []string, extra int) bool {
	return slices.Equal(got, want) || len(got) <= len(want)+extra && slices.Equal(slices.Compact(slices.Clone(got)), want)
}

// TestNotifyCooldown: within the cooldown of a committed notifier, enqueues of
// the same Client into the same queue leave their notification out, on pgx and
// database/sql alike; other queues, other databases, later enqueues, and a Client
// with NotifyCooldown -1 notify.
func TestNotifyCooldown(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	l := listen(t, b.url)
	c := newClient(t, outbox.Config{NotifyCooldown: time.Hour})

	enqueueNow(t, c, b.pool, "cool", "a")
	skipped := []time.Duration{enqueueNow(t, c, b.pool, "cool", "b")}
	db, t0 := b.sqlDB(t), time.Now()
	if _, err := c.EnqueueSQL(ctx, db, outbox.Task{Queue: "cool", ID: "c"}); err != nil {
		t.Fatal(err)
	}
	skipped = append(skipped, time.Since(t0))
	enqueueNow(t, c, b.pool, "other", "a")
	skipped = append(skipped, enqueueNow(t, c, b.pool, "other", "b"))
	// Due later than NotifyWithin: never a notification, nor a notifier.
	if _, err := c.Enqueue(ctx, b.pool, outbox.Task{Queue: "later", ID: "a", Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	enqueueNow(t, c, b.pool, "later", "b")
	if got, want := notifications(t, b.pool, l), []string{"cool", "other", "later"}; !equalBut(got, want, lateCommits(skipped...)) {
		t.Fatalf("notifications %q, want %q: one per queue (%d late commits)", got, want, lateCommits(skipped...))
	}
	if n := count(t, b.pool, "true"); n != 7 {
		t.Fatalf("%d rows, want 7", n)
	}

	// Another database of the same server: its relay heard nothing, so the
	// notifier of the first one covers nothing there, and every commit notifies
	// while it is remembered.
	url2 := testenv.PostgresURL(t)
	pool2 := testenv.Pool(t, url2)
	l2 := listen(t, url2)
	enqueueNow(t, c, pool2, "cool", "x")
	enqueueNow(t, c, pool2, "cool", "y")
	if got, want := notifications(t, pool2, l2), []string{"cool", "cool"}; !slices.Equal(got, want) {
		t.Fatalf("other database: notifications %q, want %q", got, want)
	}

	// After the cooldown, the next enqueue notifies again.
	short := newClient(t, outbox.Config{NotifyCooldown: 50 * time.Millisecond})
	enqueueNow(t, short, b.pool, "short", "a")
	enqueueNow(t, short, b.pool, "short", "b")
	time.Sleep(60 * time.Millisecond) // the cooldown is what is tested
	enqueueNow(t, short, b.pool, "short", "c")
	if got := notifications(t, b.pool, l); len(got) < 2 || got[0] != "short" || got[len(got)-1] != "short" {
		t.Fatalf("50ms cooldown: notifications %q, want short at least twice", got)
	}

	each := newClient(t, outbox.Config{NotifyCooldown: -1})
	for _, id := range []string{"a", "b", "c"} {
		enqueueNow(t, each, b.pool, "each", id)
	}
	if got, want := notifications(t, b.pool, l), []string{"each", "each", "each"}; !slices.Equal(got, want) {
		t.Fatalf("NotifyCooldown -1: notifications %q, want %q", got, want)
	}

	if d := newClient(t, outbox.Config{}).Config().NotifyCooldown; d != 25*time.Millisecond {
		t.Errorf("default NotifyCooldown %v", d)
	}
	if _, err := outbox.New(outbox.Config{NotifyCooldown: -2}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("NotifyCooldown -2: %v, want ErrInvalidConfig", err)
	}
}

// TestNotifierRolledBack: a notifier in progress or rolled back (also to a
// savepoint, its transaction committing) covers nothing, so the commits after it
// notify: a rolled-back notifier never leaves a later commit unannounced.
func TestNotifierRolledBack(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	l := listen(t, b.url)
	c := newClient(t, outbox.Config{NotifyCooldown: time.Hour})

	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)             //nolint:errcheck
	enqueueNow(t, c, tx, "q", "open")  // the notifier, in progress
	enqueueNow(t, c, b.pool, "q", "a") // must notify: the notifier may roll back
	if got, want := notifications(t, b.pool, l), []string{"q"}; !slices.Equal(got, want) {
		t.Fatalf("notifier in progress: notifications %q, want %q", got, want)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	enqueueNow(t, c, b.pool, "q", "b") // the notifier rolled back: must notify
	enqueueNow(t, c, b.pool, "q", "c")
	if got, want := notifications(t, b.pool, l), []string{"q", "q"}; !slices.Equal(got, want) {
		t.Fatalf("notifier rolled back: notifications %q, want %q", got, want)
	}
	if n := count(t, b.pool, "queue = 'q'"); n != 3 {
		t.Fatalf("%d rows, want 3", n)
	}

	// A notifier rolled back to a savepoint, in a transaction that commits: its
	// notification was dropped with it, so it covers nothing either.
	c2 := newClient(t, outbox.Config{NotifyCooldown: time.Hour})
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		sp, err := tx.Begin(ctx) // SAVEPOINT
		if err != nil {
			return err
		}
		enqueueNow(t, c2, sp, "sp", "rolled-back")
		if err := sp.Rollback(ctx); err != nil { // ROLLBACK TO SAVEPOINT
			return err
		}
		enqueueNow(t, newClient(t, outbox.Config{}), tx, "other", "kept") // the transaction commits a task
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	enqueueNow(t, c2, b.pool, "sp", "after")
	if got, want := notifications(t, b.pool, l), []string{"other", "sp"}; !slices.Equal(got, want) {
		t.Fatalf("notifier rolled back to a savepoint: notifications %q, want %q", got, want)
	}
}

// TestLateCommitNotifies: an enqueue that left its notification out marks its row
// with its channel, and its transaction's commit notifies when it comes 25ms or
// more after the transaction began, on a custom channel too. No other row is
// marked, so no other insert queues the commit-time trigger: not the notifier's,
// not one due later than NotifyWithin, not EnqueueMany's, not a plain INSERT's.
func TestLateCommitNotifies(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	l := listen(t, b.url)
	c := newClient(t, outbox.Config{NotifyCooldown: time.Hour})

	enqueueNow(t, c, b.pool, "q", "notifier")
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		enqueueNow(t, c, tx, "q", "late")
		if _, err := c.Enqueue(ctx, tx, outbox.Task{Queue: "q", ID: "later", Delay: time.Hour}); err != nil {
			return err
		}
		if _, err := c.EnqueueMany(ctx, tx, []outbox.Task{{Queue: "q", ID: "many-1"}, {Queue: "q", ID: "many-2"}}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts) VALUES ('q', 'plain', now(), '', 1)`)
		time.Sleep(50 * time.Millisecond) // the transaction's own work: its commit is late
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// The notifier's, then the late commit's once (EnqueueMany's notification at
	// that commit is the same: Postgres folds them).
	if got, want := notifications(t, b.pool, l), []string{"q", "q"}; !slices.Equal(got, want) {
		t.Fatalf("notifications %q, want %q", got, want)
	}
	if n := count(t, b.pool, "notify_late = $1", taskstate.DefaultNotifyChannel); n != 1 {
		t.Fatalf("%d rows marked, want 1", n)
	}
	if n := count(t, b.pool, "task_id = 'late' AND notify_late IS NOT NULL"); n != 1 {
		t.Fatalf("the late enqueue's row is not the one marked")
	}

	// A skipped enqueue rolled back to its savepoint, in a late transaction that
	// commits: nothing of it is left, nor its notification.
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		sp, err := tx.Begin(ctx) // SAVEPOINT
		if err != nil {
			return err
		}
		enqueueNow(t, c, sp, "q", "rolled-back")
		if err := sp.Rollback(ctx); err != nil { // ROLLBACK TO SAVEPOINT
			return err
		}
		time.Sleep(50 * time.Millisecond)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := notifications(t, b.pool, l); len(got) != 0 {
		t.Fatalf("a skipped enqueue rolled back to its savepoint: notifications %q, want none", got)
	}

	// On a channel of the Client's own, the late commit notifies on it.
	const channel = "late_custom"
	lc, err := pgx.Connect(ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close(context.Background()) //nolint:errcheck
	if _, err := lc.Exec(ctx, "LISTEN "+channel); err != nil {
		t.Fatal(err)
	}
	custom := newClient(t, outbox.Config{NotifyChannel: channel, NotifyCooldown: time.Hour})
	enqueueNow(t, custom, b.pool, "custom", "notifier")
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		enqueueNow(t, custom, tx, "custom", "late")
		time.Sleep(50 * time.Millisecond)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := lc.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("custom channel: notification %d of 2: %v", i+1, err)
		}
		if n.Channel != channel || n.Payload != "custom" {
			t.Fatalf("custom channel: notification %q on %q", n.Payload, n.Channel)
		}
	}
}
