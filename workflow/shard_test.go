package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/migrations"
	"github.com/delayq/delayq/outbox"
)

var shardStatements = taskstate.NewStatements(taskstate.Config{Schema: taskstate.DefaultSchema, NotifyChannel: taskstate.DefaultNotifyChannel})

// finish finishes the children keyed by ids (queue q) in one transaction at
// iso, as state (one child), or by GuardMany, or GuardGroup when state is
// "group" (several: the guards of a group commit), retrying a serialization failure as the worker does. A
// deadlock fails the test.
func finish(ctx context.Context, b *bundle, iso pgx.TxIsoLevel, state string, ids []string) error {
	for {
		err := pgx.BeginTxFunc(ctx, b.e.Pool, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) error {
			// a read first, as a handler's: the snapshot predates the finish
			if _, err := tx.Exec(ctx, `SELECT count(*) FROM delayq_batches`); err != nil {
				return err
			}
			if len(ids) == 1 {
				_, err := tx.Exec(ctx, `UPDATE delayq_outbox SET state = $2, done_at = now() WHERE queue = 'q' AND task_id = $1`, ids[0], state)
				return err
			}
			qs, vs, clear := make([]string, len(ids)), make([]int32, len(ids)), make([]bool, len(ids))
			for i := range ids {
				qs[i] = "q"
			}
			rows, err := tx.Query(ctx, `SELECT task_id, version FROM delayq_outbox WHERE queue = 'q' AND task_id = ANY($1)`, ids)
			if err != nil {
				return err
			}
			version := map[string]int32{}
			var id string
			var v int32
			if _, err := pgx.ForEachRow(rows, []any{&id, &v}, func() error { version[id] = v; return nil }); err != nil {
				return err
			}
			for i, id := range ids {
				vs[i] = version[id]
			}
			switch state {
			case "group":
				_, err = tx.Exec(ctx, shardStatements.GuardGroup, qs, ids, vs, clear, clear)
			case "reap": // the reaper's: out of attempts after a lost lease
				attempts, errs := make([]int32, len(ids)), make([]string, len(ids))
				for i := range ids {
					attempts[i], errs[i] = 25, "lease expired"
				}
				_, err = tx.Exec(ctx, shardStatements.MarkDead, qs, ids, vs, attempts, errs)
			default:
				_, err = tx.Exec(ctx, shardStatements.GuardMany, qs, ids, vs, clear)
			}
			return err
		})
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "40001" {
			continue
		}
		return err
	}
}

// The children of several batches, each spread over its shards (1 to 16),
// finish in a random order from eight goroutines: one at a time under READ
// COMMITTED and under REPEATABLE READ (a serialization failure retried), and
// groups of twelve across batches and shards in one statement (GuardMany,
// GuardGroup and the reaper's MarkDead, which lock their shards sorted: no
// deadlock). Each callback is released exactly once, and the counts are the
// children's states.
func TestBatchShardsRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	sizes := []int{1, 2, 15, 16, 17, 40, 250}
	var keys []string
	for _, n := range sizes {
		kids := children("q", fmt.Sprintf("s%d-", n), n)
		b.batch(t, outbox.Task{Queue: "r", ID: fmt.Sprint("cb-", n)}, kids)
		for _, k := range kids {
			keys = append(keys, k.ID)
		}
	}
	var shards, want int
	if err := b.e.Pool.QueryRow(ctx, `SELECT count(*) FROM delayq_batch_shards`).Scan(&shards); err != nil {
		t.Fatal(err)
	}
	for _, n := range sizes {
		want += min(n, taskstate.BatchShards)
	}
	if shards != want {
		t.Fatalf("%d shard rows, want %d", shards, want)
	}
	released := noteReleases(t, b)
	rand.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	type item struct {
		iso   pgx.TxIsoLevel
		state string
		ids   []string
	}
	work := make(chan item, len(keys))
	for i := 0; i < len(keys); {
		switch {
		case i%5 == 0:
			k := min(i+12, len(keys))
			st := "done"
			switch {
			case i%10 == 0:
				st = "group"
			case i%20 == 5:
				st = "reap"
			}
			work <- item{pgx.ReadCommitted, st, keys[i:k]}
			i = k
		case i%3 == 0:
			work <- item{pgx.RepeatableRead, "done", keys[i : i+1]}
			i++
		default:
			st := "done"
			if i%7 == 1 {
				st = "dead"
			}
			work <- item{pgx.ReadCommitted, st, keys[i : i+1]}
			i++
		}
	}
	close(work)
	var wg sync.WaitGroup
	errs := make(chan error, len(keys))
	for range 8 {
		wg.Go(func() {
			for it := range work {
				if err := finish(ctx, b, it.iso, it.state, it.ids); err != nil {
					errs <- fmt.Errorf("%v %v: %w", it.iso, it.ids, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := released()
	if len(got) != len(sizes) {
		t.Errorf("releases: %v", got)
	}
	for _, n := range sizes {
		cb := fmt.Sprint("cb-", n)
		if got[cb] != 1 {
			t.Errorf("%s released %d times", cb, got[cb])
		}
		if r := b.row(t, "r", cb); r.state != delayqtype.StatePending {
			t.Errorf("%s: %+v", cb, r)
		}
		var done, dead int
		if err := b.e.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state = 'dead')
			FROM delayq_outbox WHERE queue = 'q' AND task_id LIKE $1`, fmt.Sprintf("s%d-%%", n)).Scan(&done, &dead); err != nil {
			t.Fatal(err)
		}
		c := b.counts(t, "r", cb)
		if c.Total != n || c.Remaining != 0 || c.Done != done || c.Dead != dead || c.Cancelled != 0 || done+dead != n || c.FinishedAt.IsZero() {
			t.Errorf("%s: counts %+v, the rows %d done, %d dead", cb, c, done, dead)
		}
	}
	var left, open int
	if err := b.e.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM delayq_batch_shards WHERE remaining <> 0),
		(SELECT count(*) FROM delayq_batches WHERE zero_shards <> shards)`).Scan(&left, &open); err != nil {
		t.Fatal(err)
	}
	if left != 0 || open != 0 {
		t.Errorf("%d shards with children remaining, %d batches with shards not through", left, open)
	}
}

// toCounterRow turns the batch of callback r/cb into what migration 00024
// wrote (one counter row, children without a shard): a batch enqueued before
// 00030.
func toCounterRow(t *testing.T, b *bundle, cb string) {
	t.Helper()
	if _, err := b.e.Pool.Exec(context.Background(), `WITH b AS (
		UPDATE delayq_batches SET remaining = total, shards = 0 WHERE queue = 'r' AND task_id = $1 RETURNING id
	), s AS (
		DELETE FROM delayq_batch_shards WHERE batch_id = (SELECT id FROM b)
	)
	UPDATE delayq_outbox SET batch_shard = NULL WHERE batch_id = (SELECT id FROM b)`, cb); err != nil {
		t.Fatal(err)
	}
}

// A batch enqueued before migration 00030 (its counter row alone) still
// counts its children, releases its callback once and cancels.
func TestBatchCounterRowBefore00030(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const n = 60
	kids := children("q", "o", n)
	b.batch(t, outbox.Task{Queue: "r", ID: "old"}, kids)
	toCounterRow(t, b, "old")
	b.batch(t, outbox.Task{Queue: "r", ID: "old-cancel"}, children("q", "x", 10))
	toCounterRow(t, b, "old-cancel")
	var sharded int
	if err := b.e.Pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE batch_shard IS NOT NULL`).Scan(&sharded); err != nil || sharded != 0 {
		t.Fatalf("%d children with a shard (%v)", sharded, err)
	}
	released := noteReleases(t, b)
	b.work(t, kids[0].ID, delayq.OutcomeSucceeded)
	work := make(chan []string, n)
	for i := 1; i < n; {
		k := i + 1
		if i%4 == 0 {
			k = min(i+5, n)
		}
		ids := make([]string, 0, k-i)
		for _, c := range kids[i:k] {
			ids = append(ids, c.ID)
		}
		work <- ids
		i = k
	}
	close(work)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range 4 {
		wg.Go(func() {
			for ids := range work {
				if err := finish(ctx, b, pgx.ReadCommitted, "done", ids); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := released(); got["old"] != 1 {
		t.Errorf("releases: %v", got)
	}
	if c := b.counts(t, "r", "old"); c.Total != n || c.Done != n || c.Remaining != 0 || c.FinishedAt.IsZero() {
		t.Errorf("counts: %+v", c)
	}
	if err := finish(ctx, b, pgx.ReadCommitted, "dead", []string{"x00000"}); err != nil {
		t.Fatal(err)
	}
	var cancelled int
	b.tx(t, func(tx pgx.Tx) (err error) {
		cancelled, err = b.wf.Cancel(ctx, tx, "r", "old-cancel")
		return err
	})
	if cancelled != 10 {
		t.Errorf("cancelled %d, want 9 children and the callback", cancelled)
	}
	if c := b.counts(t, "r", "old-cancel"); c.Total != 10 || c.Dead != 1 || c.Cancelled != 9 || c.Remaining != 0 || c.FinishedAt.IsZero() {
		t.Errorf("counts of the cancelled batch: %+v", c)
	}
}

// Migration 00030's Down adds the shards' counts into their batch's row,
// where 00024's trigger goes on counting: a batch half finished across the
// rollback completes once with the right counts, and Up again leaves it so.
// A callback's deletion takes its batch's shards with it.
func TestBatchShardsDownUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const n = 40
	kids := children("q", "d", n)
	b.batch(t, outbox.Task{Queue: "r", ID: "cb"}, kids)
	for i, k := range kids[:11] {
		st := "done"
		if i == 3 {
			st = "dead"
		}
		if err := finish(ctx, b, pgx.ReadCommitted, st, []string{k.ID}); err != nil {
			t.Fatal(err)
		}
	}
	m, err := migrations.New(migrations.OpenDBFromPool(b.e.Pool), migrations.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.DownTo(ctx, 29); err != nil {
		t.Fatal(err)
	}
	var remaining, done, dead int
	if err := b.e.Pool.QueryRow(ctx, `SELECT remaining, done, dead FROM delayq_batches WHERE task_id = 'cb'`).Scan(&remaining, &done, &dead); err != nil {
		t.Fatal(err)
	}
	if remaining != n-11 || done != 10 || dead != 1 {
		t.Fatalf("after Down: remaining %d, done %d, dead %d", remaining, done, dead)
	}
	released := noteReleases(t, b)
	for _, k := range kids[11:] {
		if err := finish(ctx, b, pgx.ReadCommitted, "done", []string{k.ID}); err != nil {
			t.Fatal(err)
		}
	}
	if got := released(); got["cb"] != 1 {
		t.Errorf("releases after Down: %v", got)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if c := b.counts(t, "r", "cb"); c.Total != n || c.Remaining != 0 || c.Done != n-1 || c.Dead != 1 || c.FinishedAt.IsZero() {
		t.Errorf("counts after Up: %+v", c)
	}
	b.batch(t, outbox.Task{Queue: "r", ID: "cb2"}, children("q", "e", 20))
	var shards int
	if err := b.e.Pool.QueryRow(ctx, `SELECT count(*) FROM delayq_batch_shards`).Scan(&shards); err != nil || shards != 16 {
		t.Fatalf("%d shard rows (%v), want 16", shards, err)
	}
	if _, err := b.e.Pool.Exec(ctx, `DELETE FROM delayq_outbox WHERE queue = 'r'`); err != nil {
		t.Fatal(err)
	}
	var batches int
	if err := b.e.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM delayq_batches), (SELECT count(*) FROM delayq_batch_shards)`).Scan(&batches, &shards); err != nil {
		t.Fatal(err)
	}
	if batches != 0 || shards != 0 {
		t.Errorf("after the callbacks' deletion: %d batches, %d shard rows", batches, shards)
	}
}
