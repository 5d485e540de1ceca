package delayq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

// Failed runs are retried after the backoff, never earlier (Redis scores and
// claim times, both on the Redis clock); after max attempts the task is dead in both
// stores with its last error, and never runs again by itself.
func TestRetriesFollowBackoffThenDead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	backoff := Backoff{Base: 100 * time.Millisecond, Max: 250 * time.Millisecond}
	type retry struct {
		attempt          int
		claimedAt, score time.Time
		redisAfter       time.Time
	}
	retries := make(chan retry, 10)
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		// Runs inside the run, before its slot frees: nothing can claim meanwhile.
		w.hooks.finished = func(tk *Task, o outcome) {
			if o != outRetried {
				return
			}
			ti := b.info(t, tk.Queue, tk.ID)
			now, err := b.rdb.Time(context.Background()).Result()
			if err != nil {
				t.Error(err)
			}
			if ti.State != dispatch.StateReady {
				t.Errorf("after attempt %d: Redis state %s, want ready", tk.Attempt, ti.State)
			}
			retries <- retry{attempt: tk.Attempt, claimedAt: tk.ClaimedAt, score: ti.Score, redisAfter: now}
		}
		_ = w.HandleTx("r", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if err := insertEffect(ctx, tx, tk, ""); err != nil {
				return err
			}
			return fmt.Errorf("boom %d", tk.Attempt)
		}, QueueConfig{Backoff: backoff})
	})
	b.enqueue(t, outbox.Task{Queue: "r", ID: "x", Payload: []byte("p"), MaxAttempts: 4})

	var prevScore time.Time
	for attempt := 1; attempt <= 4; attempt++ {
		f := h.next(t)
		if f.task.Attempt != attempt {
			t.Fatalf("run %d has attempt %d", attempt, f.task.Attempt)
		}
		if attempt > 1 {
			// Due is the score the retry set; the claim came no earlier.
			if !f.task.Due.Equal(prevScore) {
				t.Errorf("attempt %d: due %v, want the retry's score %v", attempt, f.task.Due, prevScore)
			}
			if f.task.ClaimedAt.Before(f.task.Due) {
				t.Errorf("attempt %d claimed at %v, before its due time %v", attempt, f.task.ClaimedAt, f.task.Due)
			}
		}
		if attempt < 4 {
			if f.out != outRetried {
				t.Fatalf("attempt %d: %s, want retried; log:\n%s", attempt, f.out, h.logs)
			}
			r := <-retries
			lo, hi := backoff.Bounds(attempt)
			if d := r.score.Sub(r.claimedAt); d < lo {
				t.Errorf("attempt %d: retry due %v after the claim, policy says at least %v", attempt, d, lo)
			}
			if d := r.score.Sub(r.redisAfter); d > hi {
				t.Errorf("attempt %d: retry due %v after it was set, policy says at most %v", attempt, d, hi)
			}
			if row := b.row(t, "r", "x"); row.attempt != attempt || row.lastError != fmt.Sprintf("boom %d", attempt) || row.state != "queued" {
				t.Errorf("after attempt %d: outbox %+v", attempt, row)
			}
			prevScore = r.score
			continue
		}
		if f.out != outDead {
			t.Fatalf("last attempt: %s, want dead", f.out)
		}
	}
	row := b.row(t, "r", "x")
	if row.state != "dead" || row.attempt != 4 || row.lastError != "boom 4" || string(row.payload) != "p" {
		t.Errorf("outbox after the last attempt: %+v", row)
	}
	ti := b.info(t, "r", "x")
	if ti.State != dispatch.StateDead || ti.LastError != "boom 4" {
		t.Errorf("Redis after the last attempt: %+v", ti)
	}
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 0 {
		t.Errorf("%d effects of failed runs", n)
	}
	s := h.w.Stats()
	if s.Failed != 4 || s.Retried != 3 || s.Dead != 1 || s.Succeeded != 0 {
		t.Errorf("stats %+v", s)
	}
	st, err := b.dq.Stats(context.Background(), "r")
	if err != nil || st.Ready != 0 || st.Active != 0 || st.Dead != 1 {
		t.Errorf("Redis stats %+v %v", st, err)
	}
}

// RetryAfter overrides the backoff; NoRetry makes the task dead at once; a queue's
// MaxAttempts caps the task's own.
func TestSteeringErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var score atomic.Value
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		w.hooks.finished = func(tk *Task, o outcome) {
			if o == outRetried {
				score.Store(b.info(t, tk.Queue, tk.ID).Score)
			}
		}
		_ = w.Handle("steer", func(ctx context.Context, tk *Task) error {
			switch {
			case tk.ID == "after" && tk.Attempt == 1:
				return RetryAfter(400*time.Millisecond, errors.New("rate limited"))
			case tk.ID == "after":
				return nil
			case tk.ID == "never":
				return NoRetry(errors.New("malformed payload"))
			}
			return errors.New("always")
		}, QueueConfig{MaxAttempts: 2, Backoff: Backoff{Base: time.Millisecond}})
	})
	b.enqueue(t, task("steer", "after"))
	f := h.expect(t, "after", outRetried)
	if d := score.Load().(time.Time).Sub(f.task.ClaimedAt); d < 400*time.Millisecond {
		t.Errorf("RetryAfter(400ms): due %v after the claim", d)
	}
	f = h.expect(t, "after", outSucceeded)
	if f.task.ClaimedAt.Sub(score.Load().(time.Time)) < 0 {
		t.Errorf("claimed before due")
	}

	b.enqueue(t, task("steer", "never"))
	h.expect(t, "never", outDead)
	if r := b.row(t, "steer", "never"); r.state != "dead" || r.attempt != 1 || r.lastError != "malformed payload" {
		t.Errorf("NoRetry: outbox %+v", r)
	}
	if ti := b.info(t, "steer", "never"); ti.State != dispatch.StateDead || ti.LastError != "malformed payload" {
		t.Errorf("NoRetry: Redis %+v", ti)
	}

	b.enqueue(t, task("steer", "capped")) // its own max attempts: 25
	// Its two runs, in the order of their attempts: the first run's report waits
	// for the hook's Redis read above, and the retry (1 ms of backoff) may report
	// before it.
	runs := []finish{h.next(t), h.next(t)}
	slices.SortFunc(runs, func(x, y finish) int { return x.task.Attempt - y.task.Attempt })
	for i, want := range []outcome{outRetried, outDead} {
		if runs[i].task.ID != "capped" || runs[i].out != want {
			t.Fatalf("run %d of capped: %s ended %q, want %q; log:\n%s", i+1, runs[i].task.ID, runs[i].out, want, h.logs)
		}
	}
	f = runs[1]
	if f.task.MaxAttempts != 2 {
		t.Errorf("MaxAttempts %d, want the queue's cap 2", f.task.MaxAttempts)
	}
	if r := b.row(t, "steer", "capped"); r.state != "dead" || r.attempt != 2 {
		t.Errorf("capped: outbox %+v", r)
	}
}

// A panicking handler is a failed run, not a crashed worker: the panic value is the
// last error, the stack goes to the log only.
func TestPanicIsAFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.HandleTx("p", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if err := insertEffect(ctx, tx, tk, ""); err != nil {
				return err
			}
			if tk.Attempt == 1 {
				panic("boom")
			}
			return nil
		}, QueueConfig{Backoff: Backoff{Base: time.Millisecond}})
	})
	b.enqueue(t, task("p", "x"))
	h.expect(t, "x", outRetried)
	if r := b.row(t, "p", "x"); r.lastError != "panic: boom" || r.attempt != 1 {
		t.Errorf("after the panic: outbox %+v", r)
	}
	h.expect(t, "x", outSucceeded)
	if r := b.row(t, "p", "x"); r.state != "done" || strings.Contains(r.lastError, "goroutine") {
		t.Errorf("outbox %+v", r)
	}
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 1 {
		t.Errorf("%d effects, want 1 (the panicking run's rolled back)", n)
	}
	logs := h.logs.String()
	mustContain(t, "log", logs, "handler panicked")
	mustContain(t, "log", logs, "failure_test.go") // the stack
	if s := h.w.Stats(); s.Failed != 1 || s.Retried != 1 || s.Succeeded != 1 {
		t.Errorf("stats %+v", s)
	}
}

// Shutdown with handlers in flight: the ones that finish within the timeout are
// completed, the others are cancelled and their leases given back; a new worker
// runs those at once. Nothing lost, no effect twice.
func TestShutdownWithHandlersInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n, conc = 20, 10
	var started atomic.Int64
	ten := make(chan struct{})
	finishNow := make(chan struct{})
	// Each transactional handler holds a connection: one per slot.
	pool := testenv.Pool(t, withParam(t, b.url, "pool_max_conns", "12"))
	first := b.startOn(t, pool, WorkerConfig{ShutdownTimeout: 300 * time.Millisecond}, func(w *worker) {
		_ = w.HandleTx("s", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			k := started.Add(1)
			if err := insertEffect(ctx, tx, tk, "first"); err != nil {
				return err
			}
			if k == conc {
				close(ten)
			}
			if k <= conc/2 {
				<-finishNow // finishes within the shutdown timeout
				return nil
			}
			<-ctx.Done() // does not finish before it is cancelled
			if !errors.Is(context.Cause(ctx), ErrShutdown) {
				t.Errorf("cause %v, want ErrShutdown", context.Cause(ctx))
			}
			return ctx.Err()
		}, QueueConfig{Concurrency: conc})
	})
	var tasks []outbox.Task
	for _, id := range ids("s", n) {
		tasks = append(tasks, task("s", id))
	}
	b.enqueue(t, tasks...)
	<-ten
	first.cancel() // shutdown begins: no more claims
	close(finishNow)
	<-first.ran
	s1 := first.w.Stats()
	if s1.Claimed != conc || s1.Succeeded != conc/2 || s1.Released != conc/2 || s1.Failed != 0 || s1.InFlight != 0 {
		t.Fatalf("first worker %+v; log:\n%s", s1, first.logs)
	}
	var released []string
	for range conc {
		f := <-first.done
		if f.out == outReleased {
			released = append(released, f.task.ID)
			if r := b.row(t, "s", f.task.ID); r.state != "queued" || r.attempt != 0 {
				t.Errorf("released %s: outbox %+v", f.task.ID, r)
			}
			if ti := b.info(t, "s", f.task.ID); ti.State != dispatch.StateReady || ti.Attempt != 0 {
				t.Errorf("released %s: Redis %+v, want ready, attempt not counted", f.task.ID, ti)
			}
		}
	}
	st, _ := b.dq.Stats(context.Background(), "s")
	if st.Active != 0 || st.Ready != n-conc/2 || st.DueNow != n-conc/2 {
		t.Errorf("Redis after shutdown: %+v", st)
	}

	second := b.startOn(t, pool, WorkerConfig{}, func(w *worker) {
		_ = w.HandleTx("s", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if tk.Attempt != 1 {
				t.Errorf("%s: attempt %d, want 1", tk.ID, tk.Attempt)
			}
			return insertEffect(ctx, tx, tk, "second")
		}, QueueConfig{Concurrency: conc})
	})
	for range n - conc/2 {
		if f := second.next(t); f.out != outSucceeded {
			t.Errorf("%s: %s", f.task.ID, f.out)
		}
	}
	if got := b.count(t, `SELECT count(*) FROM effects`); got != n {
		t.Errorf("%d effects, want %d", got, n)
	}
	if got := b.count(t, `SELECT count(DISTINCT task_id) FROM effects`); got != n {
		t.Errorf("%d tasks with effects, want %d", got, n)
	}
	if got := b.count(t, `SELECT count(*) FROM delayq_outbox WHERE state = 'done'`); got != n {
		t.Errorf("%d done, want %d", got, n)
	}
	for _, id := range released {
		if got := b.count(t, `SELECT count(*) FROM effects WHERE task_id = $1 AND worker = 'second'`, id); got != 1 {
			t.Errorf("released task %s: %d effects by the second worker", id, got)
		}
	}
	if s2 := second.w.Stats(); s2.Succeeded != n-conc/2 || s2.Suppressed != 0 {
		t.Errorf("second worker %+v", s2)
	}
}

// Heartbeats keep a run alive far past its lease while the reaper runs; when the
// lease is lost anyway (here: its token overwritten, as a takeover would), the next
// heartbeat cancels the handler with ErrLeaseLost and nothing is recorded but the
// run in the task's attempt history (lease_lost).
func TestHeartbeatsKeepLeaseAndLostLeaseCancels(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.reaper(t, "hb")
	lease := 300 * time.Millisecond
	var runs atomic.Int64
	started := make(chan string, 2)
	h := b.start(t, WorkerConfig{Lease: lease, HeartbeatInterval: 50 * time.Millisecond}, func(w *worker) {
		_ = w.Handle("hb", func(ctx context.Context, tk *Task) error {
			runs.Add(1)
			started <- tk.ID
			if tk.ID == "long" {
				time.Sleep(5 * lease) // the handler ignores ctx: only the heartbeats keep it
				return nil
			}
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), ErrLeaseLost) {
				t.Errorf("handler context cause %v, want ErrLeaseLost", context.Cause(ctx))
			}
			return ctx.Err()
		}, QueueConfig{Concurrency: 2})
	})
	b.enqueue(t, task("hb", "long"))
	if f := h.expect(t, "long", outSucceeded); f.task.Attempt != 1 {
		t.Errorf("long run: attempt %d, want 1", f.task.Attempt)
	}
	if got := runs.Load(); got != 1 {
		t.Fatalf("%d runs of a task whose lease was kept, want 1", got)
	}

	b.enqueue(t, task("hb", "lost"))
	if id := <-started; id != "long" { // drain the first run's start
		t.Fatalf("started %s", id)
	}
	if id := <-started; id != "lost" {
		t.Fatalf("started %s", id)
	}
	k, err := b.dq.Keys("hb")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.rdb.HSet(context.Background(), k.TaskKey("lost"), "t", "someone-else").Err(); err != nil {
		t.Fatal(err)
	}
	h.expect(t, "lost", outLeaseLost)
	if s := h.w.Stats(); s.LeaseLost != 1 || s.Succeeded != 1 {
		t.Errorf("stats %+v", s)
	}
	if r := b.row(t, "hb", "lost"); r.state != "queued" || r.attempt != 0 {
		t.Errorf("outbox %+v after a lost lease, want queued, attempt 0", r)
	}
	if a := b.attempts(t, "hb", "lost"); len(a) != 1 || a[0].Outcome != "lease_lost" || a[0].Attempt != 1 ||
		!strings.Contains(a[0].Error, "context canceled") {
		t.Errorf("history after a lost lease: %+v", a)
	}
}

// The guard and the COMMIT travel together; neither a COMMIT that fails (a
// deferred constraint) nor a handler that swallowed a statement error and returned
// nil (an aborted transaction) may mark the task done: the run fails, nothing of it
// is kept, and the retry completes the task once.
func TestFailedCommitRecordsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(context.Background(), `CREATE TABLE once (id text,
		CONSTRAINT once_id UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	h := b.start(t, WorkerConfig{}, func(w *worker) {
		_ = w.HandleTx("c", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if err := insertEffect(ctx, tx, tk, ""); err != nil {
				return err
			}
			if tk.Attempt > 1 {
				return nil
			}
			switch tk.ID {
			case "deferred": // fails only at COMMIT
				_, err := tx.Exec(ctx, `INSERT INTO once VALUES ('x'), ('x')`)
				return err
			default: // "swallowed": the transaction is aborted, the handler says nil
				_, _ = tx.Exec(ctx, `SELECT 1 / 0`)
				return nil
			}
		}, QueueConfig{Backoff: Backoff{Base: time.Millisecond, Max: time.Millisecond}})
	})
	b.enqueue(t, task("c", "deferred"), task("c", "swallowed"))
	outcomes := map[string][]outcome{}
	for range 4 {
		f := h.next(t)
		outcomes[f.task.ID] = append(outcomes[f.task.ID], f.out)
	}
	for _, id := range []string{"deferred", "swallowed"} {
		if got := outcomes[id]; len(got) != 2 || got[0] != outRetried || got[1] != outSucceeded {
			t.Errorf("%s: outcomes %v, want retried then succeeded", id, got)
		}
		if r := b.row(t, "c", id); r.state != "done" || r.attempt != 1 || r.lastError == "" {
			t.Errorf("%s: outbox row %+v, want done after one recorded failure", id, r)
		}
		if n := b.count(t, `SELECT count(*) FROM effects WHERE task_id = $1`, id); n != 1 {
			t.Errorf("%s: %d effect rows, want 1 (the second run's)", id, n)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM once`); n != 0 {
		t.Errorf("%d rows of the failed commit kept", n)
	}
}

// extendCounter counts the extend script calls on a Redis client and the most
// leases one of them carried.
type extendCounter struct {
	calls, most atomic.Int64
}

func (c *extendCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *extendCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (c *extendCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// EVALSHA sha numkeys keys... args...: extend is the worker's only script
		// with two keys (active, task prefix); its args are a lease and pairs.
		if a := cmd.Args(); len(a) > 3 && (a[0] == "evalsha" || a[0] == "eval") && fmt.Sprint(a[2]) == "2" {
			c.calls.Add(1)
			n := int64(len(a)-6) / 2
			for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
			}
		}
		return next(ctx, cmd)
	}
}

// One heartbeat renews every lease of a queue with one call, and a lease Redis
// refuses cancels that run's handler only: the others keep their leases and
// complete.
func TestHeartbeatsRenewAllLeasesInOneCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var counter extendCounter
	b.rdb.AddHook(&counter)
	lease, every := 300*time.Millisecond, 50*time.Millisecond
	started := make(chan string, 4)
	release := make(chan struct{})
	h := b.start(t, WorkerConfig{Lease: lease, HeartbeatInterval: every}, func(w *worker) {
		_ = w.Handle("hb4", func(ctx context.Context, tk *Task) error {
			started <- tk.ID
			select {
			case <-release: // ignores ctx otherwise: only the heartbeats keep the lease
				return nil
			case <-ctx.Done():
				if !errors.Is(context.Cause(ctx), ErrLeaseLost) {
					t.Errorf("%s: handler context cause %v, want ErrLeaseLost", tk.ID, context.Cause(ctx))
				}
				return ctx.Err()
			}
		}, QueueConfig{Concurrency: 4})
	})
	b.enqueue(t, task("hb4", "a"), task("hb4", "b"), task("hb4", "c"), task("hb4", "d"))
	for range 4 {
		<-started
	}
	// A beat that carried all four leases, before one is taken: the four runs
	// start at moments the machine's load decides, so wait for it, not a clock.
	for deadline := time.Now().Add(time.Minute); counter.most.Load() < 4; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no heartbeat carried the four leases within a minute (at most %d)", counter.most.Load())
		}
	}
	begin, callsBefore := time.Now(), counter.calls.Load()
	k, err := b.dq.Keys("hb4")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.rdb.HSet(context.Background(), k.TaskKey("b"), "t", "someone-else").Err(); err != nil {
		t.Fatal(err)
	}
	h.expect(t, "b", outLeaseLost)
	// The others outlive their lease several times over, then finish.
	time.Sleep(3 * lease)
	close(release)
	got := map[string]outcome{}
	for range 3 {
		f := h.next(t)
		got[f.task.ID] = f.out
	}
	elapsed := time.Since(begin)
	for _, id := range []string{"a", "c", "d"} {
		if got[id] != outSucceeded {
			t.Errorf("run %s ended %q, want succeeded; log:\n%s", id, got[id], h.logs)
		}
	}
	if s := h.w.Stats(); s.LeaseLost != 1 || s.Succeeded != 3 {
		t.Errorf("stats %+v", s)
	}
	// A beat every every/2 at most since begin, one call each (plus two for the
	// rounding), and the calls carried all four leases at once.
	if calls, most := counter.calls.Load()-callsBefore, counter.most.Load(); calls > int64(elapsed/(every/2))+2 || most != 4 {
		t.Errorf("%d extend calls in %v (beats every %v), at most %d leases a call, want 4", calls, elapsed, every/2, most)
	}
}
