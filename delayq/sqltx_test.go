package delayq

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/outbox"
)

// sqlDB opens the bundle's database through database/sql and pgx's stdlib driver.
func (b *bundle) sqlDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", b.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// database/sql handlers commit their writes with the completion, exactly once: a
// failed run rolls back, a duplicate delivery is refused by the guard, a handler
// that ends its transaction makes the task dead.
func TestSQLTxHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := b.sqlDB(t)
	orders := outbox.Queue[order]{Name: "typed"}
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		if err := w.HandleSQLTx("q", db, func(ctx context.Context, tx *sql.Tx, tk *Task) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO effects (task_id, attempt) VALUES ($1, $2)`, tk.ID, tk.Attempt); err != nil {
				return err
			}
			switch {
			case tk.ID == "fails" && tk.Attempt == 1:
				return errors.New("first run fails")
			case tk.ID == "commits":
				return tx.Commit()
			}
			return nil
		}, QueueConfig{Backoff: Backoff{Base: 1e6, Max: 1e6}}); err != nil {
			t.Error(err)
		}
		if err := RegisterSQL(clientOf(w), db, orders, func(ctx context.Context, tx *sql.Tx, tk *Task, o order) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO effects (task_id, attempt, worker) VALUES ($1, $2, 'typed')`, o.ID, o.Amount)
			return err
		}, QueueConfig{}); err != nil {
			t.Error(err)
		}
		if err := w.HandleSQLTx("nil", nil, func(context.Context, *sql.Tx, *Task) error { return nil }, QueueConfig{}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("nil db: %v", err)
		}
	})
	var tasks []outbox.Task
	for _, id := range ids("t", 50) {
		tasks = append(tasks, task("q", id))
	}
	b.enqueue(t, tasks...)
	for range 50 {
		if f := h.next(t); f.out != outSucceeded {
			t.Fatalf("%s: %s", f.task.ID, f.out)
		}
	}
	if n := b.count(t, `SELECT count(DISTINCT task_id) FROM effects WHERE task_id LIKE 't-%' HAVING count(*) = 50`); n != 50 {
		t.Errorf("%d distinct effects of 50 tasks", n)
	}
	if n := b.count(t, `SELECT count(*) FROM delayq_outbox WHERE state = 'done'`); n != 50 {
		t.Errorf("%d done", n)
	}

	b.enqueue(t, task("q", "fails"))
	h.expect(t, "fails", outRetried)
	h.expect(t, "fails", outSucceeded)
	if n := b.count(t, `SELECT count(*) FROM effects WHERE task_id = 'fails'`); n != 1 {
		t.Errorf("%d effects of a task that failed once", n)
	}

	// A copy whose row is finished already (a duplicate delivery): refused.
	ctx := context.Background()
	if _, err := b.ob.Enqueue(ctx, b.pool, task("q", "dup")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'done' WHERE task_id = 'dup'`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.dq.Enqueue(ctx, "q", dispatch.Task{ID: "dup", Version: 1}); err != nil {
		t.Fatal(err)
	}
	h.expect(t, "dup", outSuppressed)
	if n := b.count(t, `SELECT count(*) FROM effects WHERE task_id = 'dup'`); n != 0 {
		t.Errorf("%d effects of a refused duplicate", n)
	}

	b.enqueue(t, task("q", "commits"))
	h.expect(t, "commits", outDead)
	r := b.row(t, "q", "commits")
	mustContain(t, "last error", r.lastError, "the handler ended its transaction")

	ot, err := orders.Task(outbox.Task{ID: "o"}, order{ID: "o", Amount: 9})
	if err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, ot, outbox.Task{Queue: "typed", ID: "garbled", Payload: []byte("{")})
	for range 2 {
		h.next(t)
	}
	if n := b.count(t, `SELECT count(*) FROM effects WHERE task_id = 'o' AND attempt = 9 AND worker = 'typed'`); n != 1 {
		t.Errorf("%d typed effects", n)
	}
	if r := b.row(t, "typed", "garbled"); r.state != "dead" {
		t.Errorf("garbled %+v", r)
	}
}

// A database/sql run that outlives its lease while another run of the task
// commits: the late run's guard refuses it and its writes roll back; one effect.
// No clock decides the order: the first run holds until the test has seen the
// reaper take its lease back (so the lease provably expired), and no reaper runs
// after that, so the second run keeps its lease however slow the machine is.
func TestSQLTxHandlerLeaseExpired(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := b.sqlDB(t)
	firstRunning, secondDone := make(chan struct{}), make(chan struct{})
	h := b.start(t, WorkerConfig{Lease: 200 * time.Millisecond, HeartbeatInterval: -1}, func(w *worker) {
		_ = w.HandleSQLTx("q", db, func(ctx context.Context, tx *sql.Tx, tk *Task) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO effects (task_id, attempt) VALUES ($1, $2)`, tk.ID, tk.Attempt); err != nil {
				return err
			}
			if tk.Attempt == 1 {
				close(firstRunning)
				select { // the lease is reaped meanwhile; attempt 2 commits
				case <-secondDone:
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Minute):
					return errors.New("attempt 2 never finished")
				}
			}
			return nil
		}, QueueConfig{})
	})
	b.enqueue(t, task("q", "x"))
	<-firstRunning
	b.reapOnce(t, "q", "x")
	second := h.expect(t, "x", outSucceeded)
	if second.task.Attempt != 2 {
		t.Fatalf("first to finish: attempt %d", second.task.Attempt)
	}
	close(secondDone)
	first := h.next(t)
	if first.task.Attempt != 1 || (first.out != outSuppressed && first.out != outLeaseLost) {
		t.Errorf("late run: attempt %d %s", first.task.Attempt, first.out)
	}
	if n := b.count(t, `SELECT count(*) FROM effects WHERE task_id = 'x'`); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM effects WHERE attempt = 2`); n != 1 {
		t.Errorf("the effect is not the second run's")
	}
}
