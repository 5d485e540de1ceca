package reconcile

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// testBundle is one test's servers and clients.
type testBundle struct {
	pool   *pgxpool.Pool
	rdb    *redis.Client
	dq     *dispatch.Client
	ob     *outbox.Client
	prefix string
	table  string
	guard  *taskstate.Store // the worker's completion guard
}

// setup gives a test its own database and, on the shared Redis, a prefix of its own.
func setup(t *testing.T) testBundle {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	return newBundle(t, testenv.Postgres(t), rdb, prefix)
}

// setupOwnRedis gives a test its own database and a Redis server of its own, which
// it may flush.
func setupOwnRedis(t *testing.T) testBundle {
	t.Helper()
	srv := testenv.OwnRedis(t)
	return newBundle(t, testenv.Postgres(t), testenv.RedisClient(t, srv.URL()), dispatch.DefaultPrefix)
}

func newBundle(t *testing.T, pool *pgxpool.Pool, rdb *redis.Client, prefix string) testBundle {
	t.Helper()
	// Short reap backoffs, so that a task handed to the reaper runs again quickly.
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix,
		ReapBackoffBase: time.Millisecond, ReapBackoffMax: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (queue text NOT NULL, task_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return testBundle{pool: pool, rdb: rdb, dq: dq, ob: ob, prefix: prefix, table: taskstate.New(taskstate.Config{Schema: ob.Config().Schema}).Table(),
		guard: taskstate.New(taskstate.Config{Schema: ob.Config().Schema})}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func (b testBundle) keys(t *testing.T, q string) dispatch.Keys {
	t.Helper()
	k, err := b.dq.Keys(q)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func (b testBundle) redisNow(t *testing.T) time.Time {
	t.Helper()
	now, err := b.rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// pgRow is an outbox row a test writes directly.
// The states, by the short names the tests use.
const (
	statePending   = delayqtype.StatePending
	stateQueued    = delayqtype.StateQueued
	stateDone      = delayqtype.StateDone
	stateDead      = delayqtype.StateDead
	stateCancelled = delayqtype.StateCancelled
)

type pgRow struct {
	queue, id          string
	state              delayqtype.State
	version, attempt   int
	runAt              time.Time
	maxAttempts        int
	payload, lastError string
}

func (b testBundle) insertRows(t *testing.T, rows ...pgRow) {
	t.Helper()
	batch := &pgx.Batch{}
	for _, r := range rows {
		if r.version == 0 {
			r.version = 1
		}
		if r.maxAttempts == 0 {
			r.maxAttempts = 5
		}
		if r.runAt.IsZero() {
			r.runAt = time.Now().Add(-time.Minute)
		}
		if r.payload == "" {
			r.payload = "payload-" + r.id
		}
		var doneAt, lastErr any
		if r.state == stateDone || r.state == stateDead || r.state == stateCancelled {
			doneAt = time.Now()
		}
		if r.lastError != "" {
			lastErr = r.lastError
		}
		batch.Queue(fmt.Sprintf(`INSERT INTO %s (queue, task_id, run_at, payload, max_attempts, state, attempt, version, done_at, last_error)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`, b.table),
			r.queue, r.id, r.runAt, []byte(r.payload), r.maxAttempts, r.state, r.attempt, r.version, doneAt, lastErr)
	}
	if err := b.pool.SendBatch(context.Background(), batch).Close(); err != nil {
		t.Fatalf("insert rows: %v", err)
	}
}

// redisTask writes a task into Redis directly, with the field layout of the
// delayq scripts: status s ("" for no hash), version, attempt, and the ZSETs
// (name → score) it is a member of.
type redisTask struct {
	queue, id string
	status    string
	version   int
	attempt   int
	token     string
	sets      map[string]float64 // "ready", "active", "dead"
}

func (b testBundle) putRedis(t *testing.T, ts ...redisTask) {
	t.Helper()
	ctx := context.Background()
	for _, x := range ts {
		k := b.keys(t, x.queue)
		if x.status != "" {
			fields := []any{"s", x.status}
			if x.status != "d" {
				v := x.version
				if v == 0 {
					v = 1
				}
				fields = append(fields, "p", "payload-"+x.id, "m", 5, "v", v)
				if x.attempt > 0 {
					fields = append(fields, "a", x.attempt)
				}
				if x.token != "" {
					fields = append(fields, "t", x.token)
				}
			}
			if err := b.rdb.HSet(ctx, k.TaskKey(x.id), fields...).Err(); err != nil {
				t.Fatal(err)
			}
		}
		for set, score := range x.sets {
			key := map[string]string{"ready": k.Ready, "active": k.Active, "dead": k.Dead}[set]
			if err := b.rdb.ZAdd(ctx, key, redis.Z{Score: score, Member: x.id}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// dump returns every Redis key of the test with its value and TTL, and every
// outbox row, so a test can prove that nothing changed.
func (b testBundle) dump(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	var keys []string
	iter := b.rdb.Scan(ctx, 0, b.prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	var sb strings.Builder
	for _, k := range keys {
		v, err := b.rdb.Dump(ctx, k).Result()
		if err != nil {
			t.Fatalf("DUMP %s: %v", k, err)
		}
		ttl := b.rdb.PTTL(ctx, k).Val() > 0
		fmt.Fprintf(&sb, "%s ttl=%v %x\n", k, ttl, v)
	}
	rows, err := b.pool.Query(ctx, fmt.Sprintf(`SELECT queue, task_id, state, version, attempt, run_at, payload,
coalesce(last_error, ''), queued_at, done_at FROM %s ORDER BY queue, task_id`, b.table))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(&sb, vals...)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return sb.String()
}

func (b testBundle) state(t *testing.T, q, id string) (state delayqtype.State, attempt, version int) {
	t.Helper()
	err := b.pool.QueryRow(context.Background(),
		fmt.Sprintf(`SELECT state, attempt, version FROM %s WHERE queue = $1 AND task_id = $2`, b.table), q, id).
		Scan(&state, &attempt, &version)
	if err != nil {
		t.Fatalf("state of %s/%s: %v", q, id, err)
	}
	return state, attempt, version
}

func (b testBundle) probe(t *testing.T, q, id string) dispatch.Probe {
	t.Helper()
	_, ps, err := b.dq.Probe(context.Background(), q, id)
	if err != nil {
		t.Fatal(err)
	}
	return ps[0]
}

// relayOnce is a minimal relay: it moves due pending rows into Redis and marks them
// queued, as package relay does. It returns how many rows it moved.
func (b testBundle) relayOnce(ctx context.Context) (int, error) {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT queue, task_id, run_at, payload, attempt, max_attempts, version
FROM %s WHERE state = 'pending' AND run_at < now() + interval '1 second'
ORDER BY run_at LIMIT 500 FOR UPDATE SKIP LOCKED`, b.table))
	if err != nil {
		return 0, err
	}
	byQueue := map[string][]dispatch.Task{}
	var qs, ids []string
	for rows.Next() {
		var q string
		var t dispatch.Task
		if err := rows.Scan(&q, &t.ID, &t.RunAt, &t.Payload, &t.Attempt, &t.MaxAttempts, &t.Version); err != nil {
			return 0, err
		}
		byQueue[q] = append(byQueue[q], t)
		qs, ids = append(qs, q), append(ids, t.ID)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	for q, ts := range byQueue {
		if _, err := b.dq.Enqueue(ctx, q, ts...); err != nil {
			return 0, err
		}
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s AS o SET state = 'queued', queued_at = now()
FROM unnest($1::text[], $2::text[]) AS u(queue, task_id)
WHERE o.queue = u.queue AND o.task_id = u.task_id AND o.state = 'pending'`, b.table), qs, ids); err != nil {
		return 0, err
	}
	return len(ids), tx.Commit(ctx)
}

// runs counts the claims of each task by a miniWorker.
type runs struct {
	mu sync.Mutex
	n  map[string]int
	// attempt and version as claimed, last claim wins
	attempt, version map[string]int
}

func newRuns() *runs {
	return &runs{n: map[string]int{}, attempt: map[string]int{}, version: map[string]int{}}
}

func (r *runs) add(ct dispatch.ClaimedTask) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := ct.Queue + "/" + ct.ID
	r.n[key]++
	r.attempt[key] = ct.Attempt
	r.version[key] = ct.Version
}

func (r *runs) snapshot() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.n))
	for k, v := range r.n {
		out[k] = v
	}
	return out
}

// workOnce is a minimal worker: it claims up to 100 due tasks of queue q and, in one
// transaction, applies each one's effect (a row in effects) only if its completion
// guard holds, then acknowledges them in Redis. It also reaps expired leases. It
// returns how many tasks it claimed.
func (b testBundle) workOnce(ctx context.Context, q string, r *runs) (int, error) {
	if _, err := b.dq.Reap(ctx, q, 1000); err != nil {
		return 0, err
	}
	cl, err := b.dq.Claim(ctx, q, 100, time.Minute)
	if err != nil || len(cl.Tasks) == 0 {
		return 0, err
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	for _, ct := range cl.Tasks {
		r.add(ct)
		applied, err := b.guard.MarkDone(ctx, tx, taskstate.Key{Queue: q, ID: ct.ID, Version: ct.Version}, false)
		if err != nil {
			return 0, err
		}
		if applied {
			if _, err := tx.Exec(ctx, `INSERT INTO effects (queue, task_id) VALUES ($1, $2)`, q, ct.ID); err != nil {
				return 0, err
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	for _, ct := range cl.Tasks {
		if err := b.dq.Complete(ctx, q, ct.ID, ct.Token); err != nil && !errors.Is(err, dispatch.ErrLeaseLost) {
			return 0, err
		}
	}
	return len(cl.Tasks), nil
}

// drain runs workers on the queues until a round finds nothing to claim, relaying
// pending rows first.
func (b testBundle) drain(t *testing.T, ctx context.Context, queues []string, r *runs) {
	t.Helper()
	for {
		n, err := b.relayOnce(ctx)
		if err != nil {
			t.Fatalf("relay: %v", err)
		}
		if n == 0 {
			break
		}
	}
	for {
		var wg sync.WaitGroup
		var mu sync.Mutex
		claimed := 0
		var firstErr error
		for _, q := range queues {
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n, err := b.workOnce(ctx, q, r)
					mu.Lock()
					defer mu.Unlock()
					claimed += n
					if err != nil && firstErr == nil {
						firstErr = err
					}
				}()
			}
		}
		wg.Wait()
		if firstErr != nil {
			t.Fatalf("worker: %v", firstErr)
		}
		if claimed > 0 {
			continue
		}
		// Nothing due: done, unless tasks wait for their due time (a backoff).
		wait := time.Duration(-1)
		for _, q := range queues {
			st, err := b.dq.Stats(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			// Active tasks with a live lease belong to someone else.
			if st.Ready+st.ExpiredLeases > 0 {
				wait = max(0, min(st.NextDue.Sub(st.Now), 50*time.Millisecond), wait)
			}
		}
		if wait < 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("drain: tasks still waiting at the deadline")
		case <-time.After(wait + time.Millisecond): // a due time, not a signal: waiting is the point
		}
	}
}

// effects counts the applied effects per "queue/id".
func (b testBundle) effects(t *testing.T) map[string]int {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT queue || '/' || task_id, count(*) FROM effects GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	var k string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&k, &n}, func() error { out[k] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func redisZ(member string, score float64) redis.Z { return redis.Z{Member: member, Score: score} }

// pause waits d or until ctx ends: the mini loops poll, as a relay without
// notifications would.
func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
