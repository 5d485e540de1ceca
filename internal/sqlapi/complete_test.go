package sqlapi_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/internal/sqlapi"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// completeEnv is a migrated database with an effects table, the Go outbox client
// and the SQL API.
type completeEnv struct {
	ctx  context.Context
	db   *pgxpool.Pool
	ob   *outbox.Client
	api  sqlapi.Client
	t    *testing.T
	task func(id string) // enqueues queue "jobs", id, payload "p-<id>"
}

func newCompleteEnv(t *testing.T) *completeEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	e := &completeEnv{ctx: ctx, db: testenv.Postgres(t), ob: ob, api: sqlapi.New(""), t: t}
	if _, err := e.db.Exec(ctx, `CREATE TABLE effects (id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	e.task = func(id string) {
		t.Helper()
		if _, err := ob.Enqueue(ctx, e.db, outbox.Task{Queue: "jobs", ID: id, Payload: []byte("p-" + id)}); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// run is a worker's transaction: the effect row for id, then the completion of
// version. It returns the completion's error (the transaction rolled back).
func (e *completeEnv) run(id string, version int) error {
	e.t.Helper()
	return pgx.BeginFunc(e.ctx, e.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(e.ctx, `INSERT INTO effects (id) VALUES ($1)`, id); err != nil {
			return err
		}
		return e.api.Complete(e.ctx, tx, "jobs", id, version)
	})
}

func (e *completeEnv) state(id string) (state string, effects int) {
	e.t.Helper()
	if err := e.db.QueryRow(e.ctx, `SELECT COALESCE((SELECT state FROM delayq_outbox WHERE queue = 'jobs' AND task_id = $1), 'none'),
		(SELECT count(*) FROM effects WHERE id = $1)`, id).Scan(&state, &effects); err != nil {
		e.t.Fatal(err)
	}
	return state, effects
}

func sqlstate(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// delayq_complete is the Go handler's guard: it marks the run's version done
// with the effect in one transaction, once; a stale version, a finished task, a
// task that does not exist and bad arguments are refused with their stable
// SQLSTATE (and Go sentinel), and the effect rolls back with the refusal.
func TestCompleteGuard(t *testing.T) {
	t.Parallel()
	e := newCompleteEnv(t)
	for _, id := range []string{"once", "moved", "cancelled"} {
		e.task(id)
	}

	if err := e.run("once", 1); err != nil {
		t.Fatalf("first completion: %v", err)
	}
	if st, n := e.state("once"); st != "done" || n != 1 {
		t.Fatalf("after the completion: %s with %d effects, want done with 1", st, n)
	}
	// A second run of the same version (a redelivery, a run whose lease was lost).
	err := e.run("once", 1)
	if sqlstate(err) != "QD021" || !errors.Is(err, outbox.ErrFinished) {
		t.Errorf("second completion: %v, want QD021 (outbox.ErrFinished)", err)
	}
	if st, n := e.state("once"); st != "done" || n != 1 {
		t.Errorf("after the second completion: %s with %d effects, want done with 1", st, n)
	}

	// A reschedule makes version 2: the run of version 1 is stale.
	if err := e.ob.Reschedule(e.ctx, e.db, "jobs", "moved", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	err = e.run("moved", 1)
	if sqlstate(err) != "QD022" || !errors.Is(err, outbox.ErrStale) {
		t.Errorf("stale version: %v, want QD022 (outbox.ErrStale)", err)
	}
	if st, n := e.state("moved"); st != "pending" || n != 0 {
		t.Errorf("after the stale completion: %s with %d effects, want pending with 0", st, n)
	}
	err = e.run("moved", 3)
	if sqlstate(err) != "QD022" {
		t.Errorf("a version not reached yet: %v, want QD022", err)
	}
	if err := e.run("moved", 2); err != nil {
		t.Errorf("completion of version 2: %v", err)
	}

	if err := e.ob.Cancel(e.ctx, e.db, "jobs", "cancelled"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id      string
		version int
		code    string
		is      error
	}{
		{"cancelled", 1, "QD021", outbox.ErrFinished},
		{"missing", 1, "QD020", outbox.ErrNotFound},
		{"moved", 0, "QD017", validate.ErrInvalidTask},
		{"moved", -1, "QD017", validate.ErrInvalidTask},
		{"bad id", 1, "QD002", validate.ErrInvalidTaskID},
	} {
		_, before := e.state(c.id)
		err := e.run(c.id, c.version)
		if sqlstate(err) != c.code || !errors.Is(err, c.is) {
			t.Errorf("%s v%d: %v, want %s (%v)", c.id, c.version, err, c.code, c.is)
		}
		if _, n := e.state(c.id); n != before {
			t.Errorf("%s v%d: the refused run's effect committed", c.id, c.version)
		}
	}
	if err := e.api.Complete(e.ctx, e.db, "bad queue", "x", 1); sqlstate(err) != "QD001" {
		t.Errorf("bad queue: %v, want QD001", err)
	}
}

// Two runs of one version completing at once: the second waits for the first's
// row lock and is refused once it commits (QD021 under READ COMMITTED, 40001
// under REPEATABLE READ), so one effect commits.
func TestCompleteConcurrent(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			e := newCompleteEnv(t)
			e.task("x")
			first, err := e.db.BeginTx(e.ctx, pgx.TxOptions{IsoLevel: iso})
			if err != nil {
				t.Fatal(err)
			}
			defer first.Rollback(e.ctx)
			second, err := e.db.BeginTx(e.ctx, pgx.TxOptions{IsoLevel: iso})
			if err != nil {
				t.Fatal(err)
			}
			defer second.Rollback(e.ctx)
			// Both transactions take their snapshot while the task is queued.
			for _, tx := range []pgx.Tx{first, second} {
				if _, err := tx.Exec(e.ctx, `SELECT count(*) FROM delayq_outbox`); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.api.Complete(e.ctx, first, "jobs", "x", 1); err != nil {
				t.Fatal(err)
			}
			var pid uint32
			if err := second.QueryRow(e.ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			refused := make(chan error, 1)
			go func() { refused <- e.api.Complete(e.ctx, second, "jobs", "x", 1) }()
			// Commit once the second completion waits on the row lock.
			for {
				var waiting bool
				if err := e.db.QueryRow(e.ctx, `SELECT COALESCE(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting); err != nil {
					t.Fatal(err)
				}
				if waiting {
					break
				}
				select {
				case err := <-refused:
					t.Fatalf("the second completion returned before the first committed: %v", err)
				case <-time.After(5 * time.Millisecond):
				}
			}
			if err := first.Commit(e.ctx); err != nil {
				t.Fatal(err)
			}
			want := map[pgx.TxIsoLevel]string{pgx.ReadCommitted: "QD021", pgx.RepeatableRead: "40001"}[iso]
			if err := <-refused; sqlstate(err) != want {
				t.Errorf("second completion: %v, want %s", err, want)
			}
		})
	}
}

// delayq_complete leaves the row the Go guard leaves (taskstate's Guard, the
// transactional handler's completion): every column alike but the key and
// done_at, with the payload kept, or emptied under delayq.clear_payload_on_done.
func TestCompleteSameRowAsGo(t *testing.T) {
	t.Parallel()
	e := newCompleteEnv(t)
	for _, clear := range []bool{false, true} {
		goID, sqlID := "go", "sql"
		if clear {
			goID, sqlID = "go-clear", "sql-clear"
		}
		e.task(goID)
		e.task(sqlID)
		store := taskstate.New(taskstate.Config{Schema: taskstate.DefaultSchema, NotifyChannel: taskstate.DefaultNotifyChannel})
		if ok, err := store.MarkDone(e.ctx, e.db, taskstate.Key{Queue: "jobs", ID: goID, Version: 1}, clear); err != nil || !ok {
			t.Fatalf("Go guard: %v %v", ok, err)
		}
		err := pgx.BeginFunc(e.ctx, e.db, func(tx pgx.Tx) error {
			if clear {
				if _, err := tx.Exec(e.ctx, `SET LOCAL delayq.clear_payload_on_done = on`); err != nil {
					return err
				}
			}
			return e.api.Complete(e.ctx, tx, "jobs", sqlID, 1)
		})
		if err != nil {
			t.Fatal(err)
		}
		// notify_late is the enqueue's (the second of two within the cooldown).
		var goRow, sqlRow map[string]any
		for id, row := range map[string]*map[string]any{goID: &goRow, sqlID: &sqlRow} {
			if err := e.db.QueryRow(e.ctx, `SELECT to_jsonb(o) - 'task_id' - 'notify_late' - 'created_at' - 'run_at' - 'done_at' - 'payload'
				|| jsonb_build_object('payload', convert_from(payload, 'UTF8'), 'has_done_at', done_at IS NOT NULL)
				FROM delayq_outbox o WHERE queue = 'jobs' AND task_id = $1`, id).Scan(row); err != nil {
				t.Fatal(err)
			}
		}
		want := map[bool]string{false: "p-", true: ""}[clear]
		if p, _ := sqlRow["payload"].(string); (want == "") != (p == "") {
			t.Errorf("clear %v: payload %q", clear, p)
		}
		delete(goRow, "payload")
		delete(sqlRow, "payload")
		if goRow["state"] != "done" || goRow["has_done_at"] != true {
			t.Errorf("Go guard's row: %v", goRow)
		}
		for k, v := range goRow {
			if !reflect.DeepEqual(sqlRow[k], v) {
				t.Errorf("clear %v: column %s: Go %v, SQL %v", clear, k, v, sqlRow[k])
			}
		}
		if len(goRow) != len(sqlRow) {
			t.Errorf("columns: Go %d, SQL %d", len(goRow), len(sqlRow))
		}
	}
}
