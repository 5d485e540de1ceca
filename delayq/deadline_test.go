package delayq_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// Tasks whose start deadline passed before any worker could claim them (the
// workers were down) are not run: each is dead with the reason, its
// OnMissedDeadline hook committed with the death exactly once, in both stores;
// tasks whose deadline is far run once, normally. The whole path: outbox, relay
// (start_by into the task hash, only when set), claim, worker. Two workers.
func TestMissedStartDeadline(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := testenv.PostgresURL(t)
	pool := testenv.Pool(t, url)
	rdb, prefix := testenv.Redis(t)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (task_id text NOT NULL, kind text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const late, onTime = 200, 200
	var tasks []outbox.Task
	now := time.Now()
	// A deadline already past is refused at enqueue (ErrInvalidStartBy): the late
	// tasks get one an hour ahead, and once they wait in Redis the test moves it
	// into the past in both stores, as the hour passing would (no sleep, no
	// margin a loaded machine could outlast).
	lateBy := now.Add(time.Hour + time.Minute).Truncate(time.Millisecond)
	for i := range late {
		tasks = append(tasks, outbox.Task{Queue: "dl", ID: fmt.Sprintf("late-%03d", i), StartBy: lateBy})
	}
	for i := range onTime {
		tasks = append(tasks, outbox.Task{Queue: "dl", ID: fmt.Sprintf("ok-%03d", i), StartBy: now.Add(time.Hour)})
	}
	tasks = append(tasks, outbox.Task{Queue: "dl", ID: "none"})
	// Without a hook: dead with the reason all the same.
	for i := range 20 {
		tasks = append(tasks, outbox.Task{Queue: "bare", ID: fmt.Sprintf("late-%03d", i), StartBy: lateBy})
	}
	if _, err := ob.EnqueueMany(ctx, pool, tasks); err != nil {
		t.Fatal(err)
	}
	// A start deadline before RunAt is refused, and writes nothing.
	if _, err := ob.Enqueue(ctx, pool, outbox.Task{Queue: "dl", ID: "never", RunAt: now.Add(time.Hour), StartBy: now}); !errors.Is(err, validate.ErrInvalidStartBy) {
		t.Fatalf("StartBy before RunAt: %v, want ErrInvalidStartBy", err)
	}

	// The relay first, alone: the tasks wait in Redis past their deadline.
	rl, err := relay.New(pool, dq.AsRedis(), relay.Config{})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	var done []chan error
	goRun := func(run func(context.Context) error) {
		d := make(chan error, 1)
		done = append(done, d)
		go func() { d <- run(runCtx) }()
	}
	t.Cleanup(func() {
		stop()
		for _, d := range done {
			<-d
		}
	})
	goRun(rl.Run)
	keys, _ := dq.Keys("dl")
	waitFor(t, ctx, "the relay to move every task", func() bool {
		n, err := rdb.ZCard(ctx, keys.Ready).Result()
		bk, _ := dq.Keys("bare")
		m, err2 := rdb.ZCard(ctx, bk.Ready).Result()
		return err == nil && err2 == nil && n == late+onTime+1 && m == 20
	})
	// start_by is in the hash only when set: the task without one has no d.
	if d, err := rdb.HExists(ctx, keys.TaskKey("none"), "d").Result(); err != nil || d {
		t.Fatalf("a task without a deadline has d in its hash: %v %v", d, err)
	}
	if d, err := rdb.HGet(ctx, keys.TaskKey("ok-000"), "d").Result(); err != nil || d != fmt.Sprint(now.Add(time.Hour).UnixMilli()) {
		t.Fatalf("ok-000's d = %q (%v), want its deadline in ms", d, err)
	}

	if d, err := rdb.HGet(ctx, keys.TaskKey("late-000"), "d").Result(); err != nil || d != fmt.Sprint(lateBy.UnixMilli()) {
		t.Fatalf("late-000's d = %q (%v), want its deadline in ms", d, err)
	}
	passDeadline(t, ctx, pool, rdb, dq, lateBy)

	var handled, hooked atomic.Int64
	for w := range 2 {
		wk, err := clientkit.NewClient(pool, dq, ob, delayq.WorkerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		err = wk.HandleTx("dl", func(ctx context.Context, tx pgx.Tx, tk *delayq.Task) error {
			handled.Add(1)
			if tk.ID[:4] == "late" {
				t.Errorf("worker %d ran %s, which missed its deadline", w, tk.ID)
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, 'ran')`, tk.ID)
			return err
		}, delayq.QueueConfig{Concurrency: 8, OnMissedDeadline: func(ctx context.Context, tx pgx.Tx, tk *delayq.Task, cause error) error {
			hooked.Add(1)
			var md *delayq.MissedDeadlineError
			if !errors.Is(cause, delayq.ErrMissedDeadline) || !errors.As(cause, &md) || !md.ClaimedAt.After(md.StartBy) {
				t.Errorf("%s: hook cause %v", tk.ID, cause)
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, 'missed')`, tk.ID)
			return err
		}})
		if err != nil {
			t.Fatal(err)
		}
		if err := wk.Handle("bare", func(context.Context, *delayq.Task) error {
			t.Error("ran a bare task that missed its deadline")
			return nil
		}, delayq.QueueConfig{}); err != nil {
			t.Fatal(err)
		}
		goRun(wk.Run)
	}
	count := func(sql string, args ...any) int {
		var n int
		if err := pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, ctx, "every task settled", func() bool {
		return count(`SELECT count(*) FROM delayq_outbox WHERE state IN ('done', 'dead')`) == late+onTime+1+20
	})
	if n := count(`SELECT count(*) FROM delayq_outbox WHERE queue = 'dl' AND state = 'dead' AND task_id LIKE 'late-%' AND last_error LIKE 'missed its start deadline%'`); n != late {
		t.Errorf("%d late tasks dead with the reason, want %d", n, late)
	}
	if n := count(`SELECT count(*) FROM delayq_outbox WHERE queue = 'bare' AND state = 'dead' AND last_error LIKE 'missed its start deadline%'`); n != 20 {
		t.Errorf("%d bare tasks dead with the reason, want 20", n)
	}
	if n := count(`SELECT count(*) FROM delayq_outbox WHERE state = 'done' AND task_id NOT LIKE 'late-%'`); n != onTime+1 {
		t.Errorf("%d other tasks done, want %d", n, onTime+1)
	}
	// Exactly once: one effect per task, of the right kind.
	if n := count(`SELECT count(*) FROM (SELECT task_id FROM effects GROUP BY task_id HAVING count(*) > 1) d`); n != 0 {
		t.Errorf("%d tasks with more than one effect", n)
	}
	if n := count(`SELECT count(*) FROM effects WHERE kind = 'missed' AND task_id LIKE 'late-%'`); n != late {
		t.Errorf("%d missed-deadline effects, want %d", n, late)
	}
	if n := count(`SELECT count(*) FROM effects WHERE kind = 'ran'`); n != onTime+1 {
		t.Errorf("%d runs, want %d", n, onTime+1)
	}
	waitFor(t, ctx, "Redis to hold the late tasks dead and nothing else", func() bool {
		st, err := dq.Stats(ctx, "dl")
		return err == nil && st.Dead == late && st.Ready == 0 && st.Active == 0
	})
	if handled.Load() != onTime+1 || hooked.Load() != late {
		t.Errorf("handler ran %d times, hook %d; want %d and %d", handled.Load(), hooked.Load(), onTime+1, late)
	}
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("not in time: %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// passDeadline moves the start deadline lateBy of every task that has it 10 s
// into the past, by Redis's clock (the one the claim compares with), in the
// tasks' hashes and in their outbox rows.
func passDeadline(t *testing.T, ctx context.Context, pool *pgxpool.Pool, rdb *redis.Client, dq *dispatch.Client, lateBy time.Time) {
	t.Helper()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	past := now.Add(-10 * time.Second).Truncate(time.Millisecond)
	rows, err := pool.Query(ctx, `UPDATE delayq_outbox SET start_by = $2 WHERE start_by = $1 RETURNING queue, task_id`, lateBy, past)
	if err != nil {
		t.Fatal(err)
	}
	moved, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var qi [2]string
		return qi, r.Scan(&qi[0], &qi[1])
	})
	if err != nil {
		t.Fatal(err)
	}
	pipe := rdb.Pipeline()
	for _, qi := range moved {
		keys, err := dq.Keys(qi[0])
		if err != nil {
			t.Fatal(err)
		}
		pipe.HSet(ctx, keys.TaskKey(qi[1]), "d", past.UnixMilli())
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}
