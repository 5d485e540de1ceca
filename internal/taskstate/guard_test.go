package taskstate

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/testenv"
)

// GuardGroup marks done exactly the completions whose rows are live at their
// version (a key given twice once), reports which, and aborts the transaction,
// and the COMMIT queued behind it, when a run that wrote is refused.
func TestGuardGroup(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	s := New(Config{Schema: "public"})
	if _, err := pool.Exec(ctx, `INSERT INTO `+s.Table()+` (queue, task_id, run_at, payload, max_attempts, state, version)
VALUES ('g', 'live', now(), '', 25, 'queued', 1), ('g', 'done', now(), '', 25, 'done', 1),
       ('g', 'newer', now(), '', 25, 'queued', 2), ('g', 'twice', now(), '', 25, 'pending', 1),
       ('g', 'kept', now(), '', 25, 'queued', 1)`); err != nil {
		t.Fatal(err)
	}
	state := func(id string) string {
		var st string
		if err := pool.QueryRow(ctx, `SELECT state FROM `+s.Table()+` WHERE queue = 'g' AND task_id = $1`, id).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	c := func(id string) Completion { return Completion{Key: Key{Queue: "g", ID: id, Version: 1}} }
	// run sends the guards with a COMMIT behind them in one round trip, as a group does.
	run := func(done []Completion, wrote []bool) ([]bool, error) {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		applied := make([]bool, len(done))
		b := &pgx.Batch{}
		if err := s.QueueGuardGroup(b, done, wrote, applied); err != nil {
			return nil, err
		}
		b.Queue("COMMIT")
		err = conn.SendBatch(ctx, b).Close()
		if st := conn.Conn().PgConn().TxStatus(); err != nil && st != 'E' {
			t.Errorf("after %v the transaction's status is %c, want E: the COMMIT must not run", err, st)
		}
		_, _ = conn.Exec(ctx, "ROLLBACK")
		return applied, err
	}

	// A refused run that wrote: nothing commits.
	if _, err := run([]Completion{c("live"), c("done")}, []bool{false, true}); !RefusedByGuard(err) {
		t.Fatalf("a refused run that wrote: %v, want the guard's refusal", err)
	}
	if st := state("live"); st != "queued" {
		t.Errorf("live is %s after the aborted group, want queued", st)
	}

	// Refused runs that wrote nothing: the others commit.
	done := []Completion{c("live"), c("done"), c("newer"), c("twice"), c("twice")}
	applied, err := run(done, []bool{true, false, false, false, false})
	if err != nil {
		t.Fatal(err)
	}
	// Either of the key given twice, not both.
	if !slices.Equal(applied[:3], []bool{true, false, false}) || applied[3] == applied[4] {
		t.Errorf("applied %v, want live and one of twice's", applied)
	}
	for id, want := range map[string]string{"live": "done", "twice": "done", "newer": "queued", "kept": "queued"} {
		if st := state(id); st != want {
			t.Errorf("%s is %s, want %s", id, st, want)
		}
	}

	// A key given twice by runs that wrote: one is refused, nothing commits.
	if _, err := run([]Completion{c("kept"), c("kept")}, []bool{true, true}); !RefusedByGuard(err) {
		t.Errorf("a key twice: %v, want the guard's refusal", err)
	}
	// Nothing applied, nothing wrote: no row, no error.
	if applied, err := run([]Completion{c("done")}, []bool{false}); err != nil || applied[0] {
		t.Errorf("none applied: %v %v", applied, err)
	}
	if err := s.QueueGuardGroup(&pgx.Batch{}, done, nil, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("lengths that differ: %v", err)
	}
	if err := s.QueueGuardGroup(&pgx.Batch{}, []Completion{{Key: Key{Queue: "g", ID: "x"}}}, []bool{false}, []bool{false}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("version 0: %v", err)
	}
}
