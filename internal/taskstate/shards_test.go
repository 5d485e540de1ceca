package taskstate

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/internal/validate"
)

// control returns queue's row of the controls table, and whether it has one.
func control(t *testing.T, s *Store, q Querier, queue string) (QueueControl, bool) {
	t.Helper()
	ctls, err := s.QueueControls(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ctls {
		if c.Queue == queue {
			return c, true
		}
	}
	return QueueControl{}, false
}

func TestSetShards(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	s := New(Config{Schema: "public"})

	// An empty queue without a row: the row is created.
	c1, err := s.SetShards(ctx, pool, "s", 4)
	if err != nil || c1.Shards != 4 || c1.Version != 1 || c1.Paused || c1.Queue != "s" {
		t.Fatalf("first SetShards: %+v, %v", c1, err)
	}
	// The same count again: success, no bump.
	c2, err := s.SetShards(ctx, pool, "s", 4)
	if err != nil || c2 != c1 {
		t.Fatalf("same count: %+v, %v; want %+v", c2, err, c1)
	}
	// A change bumps the version; a pause keeps the count, the count keeps the pause
	// and the limit.
	c3, err := s.SetShards(ctx, pool, "s", 8)
	if err != nil || c3.Shards != 8 || c3.Version != c1.Version+1 {
		t.Fatalf("8 shards: %+v, %v", c3, err)
	}
	p, err := s.SetPaused(ctx, pool, "s", true)
	if err != nil || p.Shards != 8 || p.Version != c3.Version+1 {
		t.Fatalf("pause: %+v, %v", p, err)
	}
	if _, err := s.SetRateLimit(ctx, pool, "s", validate.RateLimit{Limit: 10}); err != nil {
		t.Fatal(err)
	}
	c4, err := s.SetShards(ctx, pool, "s", 1)
	if err != nil || c4.Shards != 1 || !c4.Paused || c4.Rate.Limit != 10 {
		t.Fatalf("back to 1 shard: %+v, %v", c4, err)
	}
	if c, ok := control(t, s, pool, "s"); !ok || c != c4 {
		t.Fatalf("QueueControls: %+v, want %+v", c, c4)
	}
	// Other controls' rows default to 1.
	if c, err := s.SetPaused(ctx, pool, "plain", true); err != nil || c.Shards != 1 {
		t.Fatalf("a new row: %+v, %v", c, err)
	}

	// Bad input: typed, nothing written.
	for _, n := range []int{0, -1, validate.MaxShards + 1} {
		if _, err := s.SetShards(ctx, pool, "s", n); !errors.Is(err, ErrInvalidArgument) || !errors.Is(err, validate.ErrInvalidShards) {
			t.Errorf("SetShards(%d) = %v, want ErrInvalidArgument and ErrInvalidShards", n, err)
		}
		if _, err := s.SetShards(ctx, pool, "fresh", n); err == nil {
			t.Errorf("SetShards(fresh, %d) succeeded", n)
		}
	}
	if _, err := s.SetShards(ctx, pool, "bad queue", 2); !errors.Is(err, ErrInvalidArgument) || !errors.Is(err, validate.ErrInvalidQueue) {
		t.Errorf("bad queue: %v", err)
	}
	if c, _ := control(t, s, pool, "s"); c != c4 {
		t.Errorf("refused counts changed the row: %+v, want %+v", c, c4)
	}
	if _, ok := control(t, s, pool, "fresh"); ok {
		t.Error("a refused count created a row")
	}
	if c, err := s.SetShards(ctx, pool, "max", validate.MaxShards); err != nil || c.Shards != validate.MaxShards {
		t.Errorf("MaxShards: %+v, %v", c, err)
	}
}

func TestSetShardsRefusesBusyQueue(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	s := New(Config{Schema: "public"})
	insert := func(queue, state string) {
		t.Helper()
		done := "NULL"
		if state != "pending" && state != "queued" {
			done = "now()"
		}
		if _, err := pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, done_at)
			VALUES ($1, $2, now() + interval '1 hour', '', 3, $3, `+done+`)`, queue, "t-"+state, state); err != nil {
			t.Fatal(err)
		}
	}
	for _, state := range []string{"pending", "queued", "dead"} {
		t.Run(state, func(t *testing.T) {
			// A queue with a row of its controls (paused), and one without.
			withRow, noRow := "row-"+state, "norow-"+state
			before, err := s.SetShards(ctx, pool, withRow, 2)
			if err != nil {
				t.Fatal(err)
			}
			insert(withRow, state)
			insert(noRow, state)

			for _, n := range []int{4, 1} {
				if _, err := s.SetShards(ctx, pool, withRow, n); !errors.Is(err, ErrQueueNotEmpty) {
					t.Errorf("%s with a %s task, to %d shards: %v, want ErrQueueNotEmpty", withRow, state, n, err)
				}
			}
			if c, _ := control(t, s, pool, withRow); c != before {
				t.Errorf("a refused change wrote: %+v, want %+v", c, before)
			}
			if _, err := s.SetShards(ctx, pool, noRow, 3); !errors.Is(err, ErrQueueNotEmpty) {
				t.Errorf("%s with a %s task: %v, want ErrQueueNotEmpty", noRow, state, err)
			}
			if c, ok := control(t, s, pool, noRow); ok {
				t.Errorf("a refused change created a row: %+v", c)
			}
			// The count the queue has already: a success that changes nothing.
			if c, err := s.SetShards(ctx, pool, withRow, 2); err != nil || c != before {
				t.Errorf("same count on a busy queue: %+v, %v; want %+v", c, err, before)
			}
			if c, err := s.SetShards(ctx, pool, noRow, 1); err != nil || c.Shards != 1 {
				t.Errorf("1 shard, the default, on a busy queue without a row: %+v, %v", c, err)
			}
		})
	}
	// Finished rows (done, cancelled) do not make a queue busy, nor do other
	// queues' rows.
	insert("finished", "done")
	if _, err := pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, done_at)
		VALUES ('finished', 'c', now(), '', 3, 'cancelled', now())`); err != nil {
		t.Fatal(err)
	}
	if c, err := s.SetShards(ctx, pool, "finished", 16); err != nil || c.Shards != 16 {
		t.Errorf("a queue of finished rows: %+v, %v", c, err)
	}
	if c, err := s.SetShards(ctx, pool, "idle", 5); err != nil || c.Shards != 5 {
		t.Errorf("a queue without rows, beside busy ones: %+v, %v", c, err)
	}
}

// TestSetShardsConcurrent changes one queue's count from many connections at once:
// each change gets a version of its own, and the row holds the change of the
// highest.
func TestSetShardsConcurrent(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	s := New(Config{Schema: "public"})
	const n = 12
	got := make([]QueueControl, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], errs[i] = s.SetShards(ctx, pool, "race", i+2) })
	}
	wg.Wait()
	var versions []int64
	last := QueueControl{}
	for i, c := range got {
		if errs[i] != nil {
			t.Fatalf("SetShards(%d): %v", i+2, errs[i])
		}
		versions = append(versions, c.Version)
		if c.Version > last.Version {
			last = c
		}
	}
	slices.Sort(versions)
	for i, v := range versions {
		if v != int64(i+1) {
			t.Fatalf("versions %v: want 1..%d, one per change", versions, n)
		}
	}
	if c, _ := control(t, s, pool, "race"); c != last {
		t.Fatalf("row %+v, want the last change %+v", c, last)
	}

	// A change inside an open transaction holds the row: a concurrent one waits for
	// its commit, then orders after it.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	inTx, err := s.SetShards(ctx, tx, "race", 40)
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	var after QueueControl
	go func() {
		var err error
		after, err = s.SetShards(ctx, pool, "race", 50)
		res <- err
	}()
	// Wait until it waits on the row lock (or returned: a failure).
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case err := <-res:
			t.Fatalf("a concurrent change did not wait for the open one: %+v, %v", after, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the concurrent change never waited on a lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil || after.Shards != 50 || after.Version != inTx.Version+1 {
		t.Fatalf("after the commit: %+v, %v; want 50 shards at version %d", after, err, inTx.Version+1)
	}
}

// TestSetShardsUsesIndexes checks SetShards's emptiness check reads the partial
// indexes of queued, dead and pending rows, never the table, on an outbox of
// mostly finished rows.
func TestSetShardsUsesIndexes(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	s := New(Config{Schema: "public"})
	// 40,000 rows over 20 queues: 1 in 20 pending, a few queued and dead, the rest
	// done. Queue q3 has no pending row (the planner's statistics of (queue, state)
	// would guess it has).
	if _, err := pool.Exec(ctx, `INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, done_at)
		SELECT 'q' || (i % 20), 't' || i, now() + (i % 86400) * interval '1 second', '', 3, st,
			CASE WHEN st IN ('pending', 'queued') THEN NULL ELSE now() END
		FROM generate_series(1, 40000) AS i,
			LATERAL (SELECT CASE WHEN i % 20 <> 3 AND i % 7 = 0 THEN 'pending'
				WHEN i % 97 = 0 THEN 'dead' WHEN i % 13 = 0 THEN 'queued' ELSE 'done' END) AS x(st)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE delayq_outbox`); err != nil {
		t.Fatal(err)
	}
	for _, queue := range []string{"q3", "idle"} {
		rows, err := pool.Query(ctx, `EXPLAIN `+s.setShardsSQL(), queue, 4)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		for _, idx := range []string{"delayq_outbox_queued_idx", "delayq_outbox_dead_idx", "delayq_outbox_pending_run_at_idx"} {
			if !strings.Contains(plan, idx) {
				t.Errorf("%s: the plan does not read %s", queue, idx)
			}
		}
		if strings.Contains(plan, "Seq Scan on delayq_outbox") {
			t.Errorf("%s: the plan reads the whole outbox", queue)
		}
		if t.Failed() {
			t.Logf("plan:\n%s", plan)
		}
	}
	if _, err := s.SetShards(ctx, pool, "q3", 4); !errors.Is(err, ErrQueueNotEmpty) {
		t.Errorf("q3 has queued rows: %v", err)
	}
	if c, err := s.SetShards(ctx, pool, "idle", 4); err != nil || c.Shards != 4 {
		t.Errorf("idle: %+v, %v", c, err)
	}
}
