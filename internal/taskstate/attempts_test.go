package taskstate

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/internal/validate"
)

// attemptsSetup is a migrated database with one live task, t/x at version 1.
func attemptsSetup(t *testing.T) (context.Context, *pgxpool.Pool, *Store, *Browse) {
	t.Helper()
	pool := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	if _, err := pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state)
VALUES ('t', 'x', now(), 'p', 100, 'queued')`); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Schema: "public", NotifyChannel: "delayq_outbox"}
	return ctx, pool, New(cfg), NewBrowser(cfg)
}

func history(t *testing.T, ctx context.Context, pool *pgxpool.Pool, b *Browse) (TaskRow, int) {
	t.Helper()
	row, ok, err := b.Task(ctx, pool, "t", "x", 0)
	if err != nil || !ok {
		t.Fatalf("task: %v %v", ok, err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT coalesce(octet_length(attempt_log::text), 0) FROM delayq_outbox WHERE task_id = 'x'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return row, n
}

var key = Key{Queue: "t", ID: "x", Version: 1}

// Two failed runs (the second a panic with its stack) and a success: the history
// is both failures with their errors, in order, and the success derived from the
// done row, the attempt after them.
func TestAttemptLogFailuresThenSuccess(t *testing.T) {
	t.Parallel()
	ctx, pool, st, b := attemptsSetup(t)
	for _, f := range []Failure{
		{Key: key, Attempt: 1, Err: "boom 1", Delay: time.Millisecond},
		{Key: key, Attempt: 2, Err: "panic: kaboom", Stack: "goroutine 7 [running]:\nmain.handler()", Delay: time.Millisecond},
	} {
		if ok, err := st.RecordFailure(ctx, pool, f); !ok || err != nil {
			t.Fatalf("record failure %d: %v %v", f.Attempt, ok, err)
		}
	}
	if _, err := pool.Exec(ctx, st.SQL.Guard, "t", "x", 1, false); err != nil {
		t.Fatal(err)
	}
	row, _ := history(t, ctx, pool, b)
	got := row.Attempts
	if len(got) != 3 {
		t.Fatalf("history %+v, want 3 entries", got)
	}
	want := []delayqtype.Attempt{
		{Attempt: 1, Version: 1, Outcome: "retried", Error: "boom 1"},
		{Attempt: 2, Version: 1, Outcome: "retried", Error: "panic: kaboom", Stack: "goroutine 7 [running]:\nmain.handler()"},
		{Attempt: 3, Version: 1, Outcome: "succeeded"},
	}
	for i, w := range want {
		g := got[i]
		if g.At.IsZero() {
			t.Errorf("entry %d has no time", i)
		}
		g.At = time.Time{}
		if g != w {
			t.Errorf("entry %d = %+v, want %+v", i, g, w)
		}
	}
	if !got[2].At.Equal(row.DoneAt) || got[1].At.After(got[2].At) {
		t.Errorf("times %v, %v; done at %v", got[1].At, got[2].At, row.DoneAt)
	}
}

// More failures than the cap keep the newest MaxAttemptLog; errors and stacks are
// cut at their bounds, and the whole history stays within MaxAttemptLogBytes.
func TestAttemptLogBounds(t *testing.T) {
	t.Parallel()
	ctx, pool, st, b := attemptsSetup(t)
	long := strings.Repeat("é", 5000) // 10,000 bytes
	stack := strings.Repeat("frame;", 5000)
	runs := validate.MaxAttemptLog + 7
	for i := 1; i <= runs; i++ {
		f := Failure{Key: key, Attempt: i, Err: fmt.Sprintf("run %d %s", i, long), Stack: stack, Delay: time.Millisecond}
		if ok, err := st.RecordFailure(ctx, pool, f); !ok || err != nil {
			t.Fatalf("record failure %d: %v %v", i, ok, err)
		}
		_, n := history(t, ctx, pool, b)
		if n > validate.MaxAttemptLogBytes {
			t.Fatalf("after run %d the history is %d bytes, more than %d", i, n, validate.MaxAttemptLogBytes)
		}
	}
	row, _ := history(t, ctx, pool, b)
	got := row.Attempts
	// Each entry is over 9 KiB: the byte bound, not the count, keeps 7 of them.
	wantN := 7
	if len(got) != wantN {
		t.Fatalf("%d entries kept, want %d", len(got), wantN)
	}
	for i, a := range got {
		if want := runs - wantN + 1 + i; a.Attempt != want {
			t.Errorf("entry %d is attempt %d, want %d (the newest kept, oldest first)", i, a.Attempt, want)
		}
		if len(a.Error) > validate.MaxAttemptErrorBytes || !strings.HasPrefix(a.Error, fmt.Sprintf("run %d é", a.Attempt)) || !strings.HasSuffix(a.Error, "…") {
			t.Errorf("entry %d: error of %d bytes, %q…", i, len(a.Error), a.Error[:20])
		}
		if len(a.Stack) > validate.MaxStackBytes || !strings.HasPrefix(a.Stack, "frame;") {
			t.Errorf("entry %d: stack of %d bytes", i, len(a.Stack))
		}
	}

	// Short errors: the count bound keeps the newest 20.
	if _, err := pool.Exec(ctx, `UPDATE delayq_outbox SET attempt_log = NULL`); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= runs; i++ {
		if ok, err := st.RecordFailure(ctx, pool, Failure{Key: key, Attempt: i, Err: "e", Delay: time.Millisecond}); !ok || err != nil {
			t.Fatalf("record failure %d: %v %v", i, ok, err)
		}
	}
	row, _ = history(t, ctx, pool, b)
	if len(row.Attempts) != validate.MaxAttemptLog || row.Attempts[0].Attempt != runs-validate.MaxAttemptLog+1 ||
		row.Attempts[len(row.Attempts)-1].Attempt != runs {
		t.Errorf("%d entries, from %d to %d; want the newest %d", len(row.Attempts), row.Attempts[0].Attempt,
			row.Attempts[len(row.Attempts)-1].Attempt, validate.MaxAttemptLog)
	}
}

// The death of a run whose retry is recorded already turns its entry dead and
// appends nothing; a cancellation, a lost lease and the reaper's death are
// entries of their own; a refused write (another version) appends nothing.
func TestAttemptLogOutcomes(t *testing.T) {
	t.Parallel()
	ctx, pool, st, b := attemptsSetup(t)
	must := func(ok bool, err error) {
		t.Helper()
		if !ok || err != nil {
			t.Fatalf("%v %v", ok, err)
		}
	}
	must(st.RecordFailure(ctx, pool, Failure{Key: key, Attempt: 1, Err: "one", Delay: time.Millisecond}))
	must(st.NoteLost(ctx, pool, key, 2, "late"))
	must(st.RecordFailure(ctx, pool, Failure{Key: key, Attempt: 3, Err: "three", Delay: time.Millisecond}))
	must(st.RecordFailure(ctx, pool, Failure{Key: key, Attempt: 3, Err: "three", Dead: true, Recorded: true}))
	if ok, err := st.RecordFailure(ctx, pool, Failure{Key: Key{Queue: "t", ID: "x", Version: 2}, Attempt: 4, Err: "other version"}); ok || err != nil {
		t.Fatalf("a failure of another version: %v %v", ok, err)
	}
	row, _ := history(t, ctx, pool, b)
	var got []string
	for _, a := range row.Attempts {
		got = append(got, fmt.Sprintf("%d %s %s", a.Attempt, a.Outcome, a.Error))
	}
	if want := "1 retried one|2 lease_lost late|3 dead three"; strings.Join(got, "|") != want {
		t.Errorf("history %q, want %q", strings.Join(got, "|"), want)
	}

	// Retried from dead: a new version, whose runs follow; the cancellation is
	// its own entry.
	if _, err := pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'queued', version = 2, attempt = 0`); err != nil {
		t.Fatal(err)
	}
	k2 := Key{Queue: "t", ID: "x", Version: 2}
	must(st.CancelRun(ctx, pool, k2, 1, "order deleted"))
	row, _ = history(t, ctx, pool, b)
	if n := len(row.Attempts); n != 4 || row.Attempts[3] != (delayqtype.Attempt{Attempt: 1, Version: 2, Outcome: "cancelled",
		Error: "order deleted", At: row.Attempts[3].At}) {
		t.Errorf("after the cancellation: %+v", row.Attempts)
	}

	// The reaper's death of a lease that expired.
	if _, err := pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'queued', version = 3, attempt = 0`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, st.SQL.MarkDead, []string{"t"}, []string{"x"}, []int32{3}, []int32{5}, []string{"lease expired"}); err != nil {
		t.Fatal(err)
	}
	row, _ = history(t, ctx, pool, b)
	if last := row.Attempts[len(row.Attempts)-1]; last.Outcome != "lease_expired" || last.Attempt != 5 || last.Version != 3 || last.Error != "" {
		t.Errorf("after the reaper: %+v", row.Attempts)
	}
}

// The history lives on the row: the retention's delete of a done row leaves
// nothing of it behind.
func TestAttemptLogPrunedWithRow(t *testing.T) {
	t.Parallel()
	ctx, pool, st, _ := attemptsSetup(t)
	if ok, err := st.RecordFailure(ctx, pool, Failure{Key: key, Attempt: 1, Err: "boom", Stack: "stack", Delay: time.Millisecond}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if _, err := pool.Exec(ctx, st.SQL.Guard, "t", "x", 1, false); err != nil {
		t.Fatal(err)
	}
	tag, err := pool.Exec(ctx, st.SQL.Prune, int64(-time.Hour.Microseconds()), 100)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("prune: %v %v", tag, err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows after the prune (%v)", n, err)
	}
	// No other table holds attempts: the history has no home but the row.
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns
		WHERE table_schema = 'public' AND column_name LIKE 'attempt_log%'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d attempt_log columns (%v), want the outbox's alone", n, err)
	}
}

// BenchmarkRecordFailure is the cost of a failure's record with the attempt
// history: "no-history" skips the history (the statement as before it, but for
// a CASE), "append-20" appends to a history of 20 short entries (trimmed back to
// 20), "append-64KiB" to one at its byte bound (entries of 1 KiB errors and 8 KiB
// stacks). One statement per op on one connection, synchronous_commit off so
// that the statement's cost is not lost in the commit's flush; on the shared test
// server: compare within a run.
func BenchmarkRecordFailure(b *testing.B) {
	ctx := context.Background()
	c, err := testenv.Postgres(b).Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Release()
	pool := c.Conn()
	if _, err := pool.Exec(ctx, `SET synchronous_commit = off`); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state)
VALUES ('t', 'x', now(), 'p', 100, 'queued')`); err != nil {
		b.Fatal(err)
	}
	st := New(Config{Schema: "public", NotifyChannel: "delayq_outbox"})
	big, stack := strings.Repeat("e", 2000), strings.Repeat("frame;", 2000)
	for _, bc := range []struct {
		name     string
		f        Failure
		recorded bool
	}{
		{"no-history", Failure{Key: key, Attempt: 1, Err: "boom", Delay: time.Millisecond, Recorded: true}, true},
		{"append-20", Failure{Key: key, Attempt: 1, Err: "boom: connection refused", Delay: time.Millisecond}, false},
		{"append-64KiB", Failure{Key: key, Attempt: 1, Err: big, Stack: stack, Delay: time.Millisecond}, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			if _, err := pool.Exec(ctx, `UPDATE delayq_outbox SET attempt_log = NULL`); err != nil {
				b.Fatal(err)
			}
			for range validate.MaxAttemptLog { // fill the history to its bound
				if ok, err := st.RecordFailure(ctx, pool, bc.f); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
			b.ResetTimer()
			for b.Loop() {
				if ok, err := st.RecordFailure(ctx, pool, bc.f); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		})
	}
}
