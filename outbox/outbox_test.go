package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"encoding/json"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/migrations"
	"github.com/delayq/delayq/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type testBundle struct {
	url    string
	pool   *pgxpool.Pool
	client *outbox.Client
}

func setup(t *testing.T) testBundle {
	t.Helper()
	url := testenv.PostgresURL(t)
	return testBundle{url: url, pool: testenv.Pool(t, url), client: newClient(t, outbox.Config{})}
}

func newClient(t *testing.T, cfg outbox.Config) *outbox.Client {
	t.Helper()
	c, err := outbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sqlDB opens the bundle's database through database/sql (pgx's stdlib driver),
// closed when the test ends.
func (b testBundle) sqlDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := migrations.OpenDB(b.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// listen returns a connection listening on the default notify channel.
func listen(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(t.Context(), "LISTEN "+taskstate.DefaultNotifyChannel); err != nil {
		t.Fatal(err)
	}
	return conn
}

// nextNotification waits (bounded) for the next notification on conn.
func nextNotification(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("no notification: %v", err)
	}
	if n.Channel != taskstate.DefaultNotifyChannel {
		t.Fatalf("notification on %q", n.Channel)
	}
	return n.Payload
}

// marker sends a notification from its own committed transaction. Notifications reach a
// listener in commit order, so when the marker arrives first, nothing committed before
// it notified.
func marker(t *testing.T, pool *pgxpool.Pool, payload string) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), `SELECT pg_notify($1, $2)`, taskstate.DefaultNotifyChannel, payload); err != nil {
		t.Fatal(err)
	}
}

func count(t *testing.T, q outbox.Querier, where string, args ...any) int {
	t.Helper()
	var n int
	if err := q.QueryRow(t.Context(), `SELECT count(*) FROM delayq_outbox WHERE `+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

type stored struct {
	state                      string
	runAt                      time.Time
	payload                    []byte
	attempt, maxAttempts, vers int
	lastError                  *string
	queuedAt, doneAt           *time.Time
}

func load(t *testing.T, q outbox.Querier, queue, id string) stored {
	t.Helper()
	var s stored
	err := q.QueryRow(t.Context(), `SELECT state, run_at, payload, attempt, max_attempts, version, last_error,
		queued_at, done_at FROM delayq_outbox WHERE queue = $1 AND task_id = $2`, queue, id).
		Scan(&s.state, &s.runAt, &s.payload, &s.attempt, &s.maxAttempts, &s.vers, &s.lastError, &s.queuedAt, &s.doneAt)
	if err != nil {
		t.Fatalf("load %s/%s: %v", queue, id, err)
	}
	return s
}

func TestEnqueueRollbackCommit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	l := listen(t, b.url)

	// Rollback: no row, no notification.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := b.client.Enqueue(ctx, tx, outbox.Task{Queue: "rolled", ID: "a"}); err != nil || res.Duplicate {
		t.Fatalf("Enqueue = %+v, %v", res, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, b.pool, "true"); n != 0 {
		t.Fatalf("%d rows after rollback", n)
	}
	marker(t, b.pool, "marker-1")
	if got := nextNotification(t, l); got != "marker-1" {
		t.Fatalf("after a rolled-back enqueue the listener heard %q first", got)
	}

	// Commit: the notification comes at commit, not before.
	tx, err = b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	res, err := b.client.Enqueue(ctx, tx, outbox.Task{Queue: "payment", ID: "order-1001", Payload: []byte(`{"amount":5}`)})
	if err != nil || res.Duplicate {
		t.Fatalf("Enqueue = %+v, %v", res, err)
	}
	if d := res.RunAt.Sub(before); d < -5*time.Second || d > 5*time.Second {
		t.Errorf("RunAt of a task without delay is %v from now", d)
	}
	marker(t, b.pool, "marker-2")
	if got := nextNotification(t, l); got != "marker-2" {
		t.Fatalf("before commit the listener heard %q", got)
	}
	if n := count(t, b.pool, "true"); n != 0 {
		t.Fatalf("another connection sees %d rows before commit", n)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := nextNotification(t, l); got != "payment" {
		t.Fatalf("after commit the listener heard %q, want the queue name", got)
	}
	s := load(t, b.pool, "payment", "order-1001")
	if s.state != "pending" || string(s.payload) != `{"amount":5}` || s.maxAttempts != validate.DefaultMaxAttempts ||
		s.vers != 1 || s.attempt != 0 || !s.runAt.Equal(res.RunAt) {
		t.Errorf("stored row %+v, result %+v", s, res)
	}

	// A duplicate writes nothing and notifies nobody.
	res, err = b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "payment", ID: "order-1001", Payload: []byte("other")})
	if err != nil || !res.Duplicate || !res.RunAt.IsZero() {
		t.Fatalf("second Enqueue = %+v, %v; want a duplicate", res, err)
	}
	marker(t, b.pool, "marker-3")
	if got := nextNotification(t, l); got != "marker-3" {
		t.Fatalf("a duplicate notified %q", got)
	}
	if s := load(t, b.pool, "payment", "order-1001"); string(s.payload) != `{"amount":5}` {
		t.Errorf("a duplicate changed the payload to %q", s.payload)
	}

	// EnqueueMany notifies once per queue, at commit.
	tx, err = b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.client.EnqueueMany(ctx, tx, []outbox.Task{
		{Queue: "x", ID: "1"}, {Queue: "y", ID: "1"}, {Queue: "x", ID: "2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := []string{nextNotification(t, l), nextNotification(t, l)}
	marker(t, b.pool, "marker-4")
	got = append(got, nextNotification(t, l))
	if !(got[0] == "x" && got[1] == "y" || got[0] == "y" && got[1] == "x") || got[2] != "marker-4" {
		t.Errorf("EnqueueMany over queues x and y notified %q", got)
	}
}

func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	const n = 64
	var (
		start      = make(chan struct{})
		wg         sync.WaitGroup
		inserted   atomic.Int64
		duplicates atomic.Int64
		errs       = make(chan error, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				res, err := b.client.Enqueue(ctx, tx, outbox.Task{
					Queue: "payment", ID: "order-1001", Payload: fmt.Appendf(nil, "from %d", i),
				})
				if err != nil {
					return err
				}
				if res.Duplicate {
					duplicates.Add(1)
				} else {
					inserted.Add(1)
				}
				// The transaction is intact: it goes on and commits.
				_, err = tx.Exec(ctx, `SELECT pg_notify('other', $1)`, fmt.Sprint(i))
				return err
			})
			if err != nil {
				errs <- fmt.Errorf("goroutine %d: %w", i, err)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if inserted.Load() != 1 || duplicates.Load() != n-1 {
		t.Errorf("inserted %d, duplicates %d; want 1 and %d", inserted.Load(), duplicates.Load(), n-1)
	}
	if c := count(t, b.pool, "queue = 'payment' AND task_id = 'order-1001'"); c != 1 {
		t.Errorf("%d rows", c)
	}
}

// queryCounter counts the statements sent on a connection.
type queryCounter struct{ n atomic.Int64 }

func (c *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestEnqueueMany(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)

	// 500 tasks exist already.
	var existing []outbox.Task
	for i := range 500 {
		existing = append(existing, outbox.Task{Queue: "bulk", ID: fmt.Sprintf("task-%05d", i*20)})
	}
	if res, err := b.client.EnqueueMany(ctx, b.pool, existing); err != nil || res.Inserted != 500 {
		t.Fatalf("EnqueueMany of 500 = %d inserted, %v", res.Inserted, err)
	}

	// 10,000 distinct tasks, 500 of them existing, then 100 repeats of earlier ones.
	tasks := make([]outbox.Task, 0, 10100)
	for i := range 10000 {
		tasks = append(tasks, outbox.Task{
			Queue: "bulk", ID: fmt.Sprintf("task-%05d", i), Payload: []byte("payload-of-20-bytes!"),
			Delay: time.Duration(i) * time.Second,
		})
	}
	for i := range 100 {
		tasks = append(tasks, outbox.Task{Queue: "bulk", ID: fmt.Sprintf("task-%05d", 1+i*97)})
	}

	conf, err := pgx.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	counter := &queryCounter{}
	conf.Tracer = counter
	conn, err := pgx.ConnectConfig(ctx, conf)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := counter.n.Load()
	start := time.Now()
	res, err := b.client.EnqueueMany(ctx, tx, tasks)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("EnqueueMany of %d tasks: %v", len(tasks), time.Since(start))
	if q := counter.n.Load() - before; q != 1 {
		t.Errorf("EnqueueMany of %d tasks sent %d statements, want 1", len(tasks), q)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	if res.Inserted != 9500 || res.Duplicates != 600 || len(res.Results) != len(tasks) {
		t.Fatalf("Inserted %d, Duplicates %d, %d results; want 9500, 600, %d",
			res.Inserted, res.Duplicates, len(res.Results), len(tasks))
	}
	for i, r := range res.Results {
		wantDup := i >= 10000 || i%20 == 0
		if r.Duplicate != wantDup || r.RunAt.IsZero() == !wantDup {
			t.Fatalf("Results[%d] = %+v, want duplicate %v", i, r, wantDup)
		}
	}
	if c := count(t, b.pool, "queue = 'bulk'"); c != 10000 {
		t.Errorf("%d rows, want 10000", c)
	}
	// The delays are kept per task.
	if d := res.Results[3601].RunAt.Sub(res.Results[1].RunAt); d != time.Hour {
		t.Errorf("task 3601 is due %v after task 1, want 1h", d)
	}
	if s := load(t, b.pool, "bulk", "task-00001"); string(s.payload) != "payload-of-20-bytes!" {
		t.Errorf("the in-batch repeat replaced the first payload: %q", s.payload)
	}

	// An empty batch does nothing.
	if res, err := b.client.EnqueueMany(ctx, b.pool, nil); err != nil || res.Inserted+res.Duplicates != 0 {
		t.Errorf("EnqueueMany(nil) = %+v, %v", res, err)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	ok := outbox.Task{Queue: "payment", ID: "order-1"}
	with := func(f func(*outbox.Task)) outbox.Task {
		task := ok
		f(&task)
		return task
	}
	cases := []struct {
		name string
		task outbox.Task
		want error
	}{
		{"empty queue", with(func(t *outbox.Task) { t.Queue = "" }), outbox.ErrInvalidQueue},
		{"queue of 65 bytes", with(func(t *outbox.Task) { t.Queue = strings.Repeat("q", 65) }), outbox.ErrInvalidQueue},
		{"queue with hash tag", with(func(t *outbox.Task) { t.Queue = "pay{x}" }), outbox.ErrInvalidQueue},
		{"queue with colon", with(func(t *outbox.Task) { t.Queue = "pay:ment" }), outbox.ErrInvalidQueue},
		{"queue with space", with(func(t *outbox.Task) { t.Queue = "pay ment" }), outbox.ErrInvalidQueue},
		{"queue not ASCII", with(func(t *outbox.Task) { t.Queue = "paiement-é" }), outbox.ErrInvalidQueue},
		{"empty id", with(func(t *outbox.Task) { t.ID = "" }), outbox.ErrInvalidTaskID},
		{"id of 201 bytes", with(func(t *outbox.Task) { t.ID = strings.Repeat("i", 201) }), outbox.ErrInvalidTaskID},
		{"id with {", with(func(t *outbox.Task) { t.ID = "a{b" }), outbox.ErrInvalidTaskID},
		{"id with }", with(func(t *outbox.Task) { t.ID = "a}b" }), outbox.ErrInvalidTaskID},
		{"id with space", with(func(t *outbox.Task) { t.ID = "a b" }), outbox.ErrInvalidTaskID},
		{"id with newline", with(func(t *outbox.Task) { t.ID = "a\nb" }), outbox.ErrInvalidTaskID},
		{"id with NUL", with(func(t *outbox.Task) { t.ID = "a\x00b" }), outbox.ErrInvalidTaskID},
		{"id not ASCII", with(func(t *outbox.Task) { t.ID = "commande-é" }), outbox.ErrInvalidTaskID},
		{"negative delay", with(func(t *outbox.Task) { t.Delay = -time.Second }), validate.ErrInvalidDelay},
		{"run-at at the epoch", with(func(t *outbox.Task) { t.RunAt = time.Unix(0, 0) }), validate.ErrInvalidRunAt},
		{"run-at before the epoch", with(func(t *outbox.Task) { t.RunAt = time.Unix(-1, 0) }), validate.ErrInvalidRunAt},
		{"run-at after 9999", with(func(t *outbox.Task) { t.RunAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }), validate.ErrInvalidRunAt},
		{"run-at and delay", with(func(t *outbox.Task) { t.RunAt = time.Now().Add(time.Hour); t.Delay = time.Hour }), validate.ErrInvalidRunAt},
		{"payload over 64 KiB", with(func(t *outbox.Task) { t.Payload = make([]byte, 64<<10+1) }), outbox.ErrPayloadTooLarge},
		{"negative max attempts", with(func(t *outbox.Task) { t.MaxAttempts = -1 }), validate.ErrInvalidMaxAttempts},
		{"max attempts over int32", with(func(t *outbox.Task) { t.MaxAttempts = 1 << 31 }), validate.ErrInvalidMaxAttempts},
	}
	sqlDB := b.sqlDB(t)

	for _, tc := range cases {
		// Enqueue in a transaction, which stays usable: nothing was sent.
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.client.Enqueue(ctx, tx, tc.task); !errors.Is(err, tc.want) {
			t.Errorf("%s: Enqueue error %v, want %v", tc.name, err, tc.want)
		}
		// EnqueueMany refuses the whole batch, naming the bad task.
		good := outbox.Task{Queue: "payment", ID: "good"}
		_, err = b.client.EnqueueMany(ctx, tx, []outbox.Task{good, tc.task, good})
		if !errors.Is(err, tc.want) || !strings.Contains(fmt.Sprint(err), "task 1 of 3") {
			t.Errorf("%s: EnqueueMany error %v, want %v naming task 1", tc.name, err, tc.want)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Errorf("%s: commit after refused input: %v", tc.name, err)
		}
		// The database/sql path validates the same way.
		stx, err := sqlDB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.client.EnqueueSQL(ctx, stx, tc.task); !errors.Is(err, tc.want) {
			t.Errorf("%s: EnqueueSQL error %v, want %v", tc.name, err, tc.want)
		}
		if _, err := b.client.EnqueueManySQL(ctx, stx, []outbox.Task{good, tc.task}); !errors.Is(err, tc.want) {
			t.Errorf("%s: EnqueueManySQL error %v, want %v", tc.name, err, tc.want)
		}
		if err := stx.Commit(); err != nil {
			t.Errorf("%s: commit after refused input: %v", tc.name, err)
		}
		// Validate agrees, and the error is short whatever the input.
		if err := b.client.Validate(tc.task); !errors.Is(err, tc.want) || len(err.Error()) > 300 {
			t.Errorf("%s: Validate = %v", tc.name, err)
		}
	}
	if n := count(t, b.pool, "true"); n != 0 {
		t.Errorf("bad input wrote %d rows", n)
	}
	// The sentinels are those of internal/validate (and so of package delayq).
	if !errors.Is(b.client.Validate(with(func(t *outbox.Task) { t.Queue = "" })), validate.ErrInvalidQueue) {
		t.Error("ErrInvalidQueue is not validate.ErrInvalidQueue")
	}

	// The limits themselves are accepted.
	edge := []outbox.Task{
		{Queue: strings.Repeat("q", 64), ID: strings.Repeat("i", 200), Payload: make([]byte, 64<<10), MaxAttempts: 1},
		{Queue: "a", ID: "colons:are:fine~!", RunAt: time.Now().Add(-time.Hour)},
		{Queue: "a.b_c-D9", ID: "x", Delay: 0, RunAt: time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)},
	}
	res, err := b.client.EnqueueMany(ctx, b.pool, edge)
	if err != nil || res.Inserted != len(edge) {
		t.Fatalf("edge cases: %+v, %v", res, err)
	}
	if s := load(t, b.pool, strings.Repeat("q", 64), strings.Repeat("i", 200)); s.maxAttempts != 1 || len(s.payload) != 64<<10 {
		t.Errorf("edge row: max_attempts %d, payload %d bytes", s.maxAttempts, len(s.payload))
	}

	// Cancel, Reschedule and the guards check their arguments too.
	if err := b.client.Cancel(ctx, b.pool, "", "x"); !errors.Is(err, outbox.ErrInvalidQueue) {
		t.Errorf("Cancel with an empty queue: %v", err)
	}
	if err := b.client.Reschedule(ctx, b.pool, "a", "x{", time.Now()); !errors.Is(err, outbox.ErrInvalidTaskID) {
		t.Errorf("Reschedule with a bad id: %v", err)
	}
	if err := b.client.Reschedule(ctx, b.pool, "a", "x", time.Time{}); !errors.Is(err, validate.ErrInvalidRunAt) {
		t.Errorf("Reschedule to the zero time: %v", err)
	}
	if _, err := b.client.MarkDone(ctx, b.pool, "a", "x", 0); !errors.Is(err, taskstate.ErrInvalidArgument) {
		t.Errorf("MarkDone at version 0: %v", err)
	}
	if _, err := b.client.RecordFailure(ctx, b.pool, "a", "x", 1, -1, "", false); !errors.Is(err, taskstate.ErrInvalidArgument) {
		t.Errorf("RecordFailure with attempt -1: %v", err)
	}
}

func TestSchedule(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	at := time.Date(2031, 5, 6, 7, 8, 9, 123456000, time.UTC)
	res, err := b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "q", ID: "at", RunAt: at, MaxAttempts: 3})
	if err != nil || !res.RunAt.Equal(at) {
		t.Fatalf("Enqueue with RunAt = %+v, %v", res, err)
	}
	if s := load(t, b.pool, "q", "at"); !s.runAt.Equal(at) || s.maxAttempts != 3 {
		t.Errorf("stored run_at %v, max_attempts %d", s.runAt, s.maxAttempts)
	}
	var dbNow time.Time
	if err := b.pool.QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	res, err = b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "q", ID: "delay", Delay: 90 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if d := res.RunAt.Sub(dbNow); d < 90*time.Minute || d > 91*time.Minute {
		t.Errorf("a 90-minute delay is due %v after the database's now", d)
	}
	// nil payload is stored as empty, not refused as NULL.
	if _, err := b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "q", ID: "nil"}); err != nil {
		t.Fatal(err)
	}
	if s := load(t, b.pool, "q", "nil"); s.payload == nil || len(s.payload) != 0 {
		t.Errorf("nil payload stored as %v", s.payload)
	}
}

func TestSQLPath(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	db := b.sqlDB(t)
	l := listen(t, b.url)

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.EnqueueSQL(ctx, tx, outbox.Task{Queue: "sql", ID: "rolled"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}

	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	payload, err := json.Marshal(map[string]int{"amount": 5})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.client.EnqueueSQL(ctx, tx, outbox.Task{Queue: "sql", ID: "a", Payload: payload, Delay: time.Minute})
	if err != nil || res.Duplicate || res.RunAt.IsZero() {
		t.Fatalf("EnqueueSQL = %+v, %v", res, err)
	}
	if res, err := b.client.EnqueueSQL(ctx, tx, outbox.Task{Queue: "sql", ID: "a"}); err != nil || !res.Duplicate {
		t.Fatalf("second EnqueueSQL = %+v, %v; want a duplicate", res, err)
	}
	many, err := b.client.EnqueueManySQL(ctx, tx, []outbox.Task{
		{Queue: "sql", ID: "a"}, {Queue: "sql", ID: "b", RunAt: time.Now().Add(time.Hour)}, {Queue: "sql", ID: "b"}, {Queue: "sql", ID: "c"},
	})
	if err != nil || many.Inserted != 2 || many.Duplicates != 2 {
		t.Fatalf("EnqueueManySQL = %+v, %v", many, err)
	}
	if _, err := tx.ExecContext(ctx, `SELECT 1`); err != nil {
		t.Fatalf("the transaction is broken after duplicates: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := nextNotification(t, l); got != "sql" {
		t.Errorf("after commit the listener heard %q", got)
	}
	if c := count(t, b.pool, "queue = 'sql'"); c != 3 {
		t.Errorf("%d rows, want 3 (a, b, c)", c)
	}
	if s := load(t, b.pool, "sql", "a"); string(s.payload) != `{"amount":5}` {
		t.Errorf("payload %q", s.payload)
	}
}

// TestNotifyWithin: only tasks due soon wake the relay at commit (Postgres
// serializes notifying commits); NotifyWithin -1 notifies for every task.
func TestNotifyWithin(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	l := listen(t, b.url)
	if _, err := b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "later", ID: "x", Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	many := []outbox.Task{{Queue: "later", ID: "y", Delay: time.Hour}, {Queue: "later", ID: "z", Delay: 2 * time.Hour}}
	if _, err := b.client.EnqueueMany(ctx, b.pool, many); err != nil {
		t.Fatal(err)
	}
	marker(t, b.pool, "marker")
	if got := nextNotification(t, l); got != "marker" {
		t.Fatalf("tasks due in an hour notified %q", got)
	}
	if _, err := b.client.EnqueueMany(ctx, b.pool, []outbox.Task{{Queue: "later", ID: "w", Delay: time.Hour}, {Queue: "soon", ID: "s"}}); err != nil {
		t.Fatal(err)
	}
	if got := nextNotification(t, l); got != "soon" {
		t.Fatalf("a batch with a task due now notified %q, want soon", got)
	}
	always := newClient(t, outbox.Config{NotifyWithin: -1})
	if _, err := always.Enqueue(ctx, b.pool, outbox.Task{Queue: "always", ID: "x", Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if got := nextNotification(t, l); got != "always" {
		t.Fatalf("NotifyWithin -1 notified %q", got)
	}
	if _, err := outbox.New(outbox.Config{NotifyWithin: -2}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("NotifyWithin -2: %v", err)
	}
}

func TestCancelReschedule(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	l := listen(t, b.url)
	each := newClient(t, outbox.Config{NotifyCooldown: -1}) // no cooldown: each enqueue notifies
	for _, id := range []string{"a", "b", "c"} {
		if _, err := each.Enqueue(ctx, b.pool, outbox.Task{Queue: "q", ID: id, Payload: []byte("p"), Delay: time.Second}); err != nil {
			t.Fatal(err)
		}
		if got := nextNotification(t, l); got != "q" {
			t.Fatalf("notification %q", got)
		}
	}
	// b is in Redis already.
	if _, err := b.pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'queued', queued_at = now() WHERE task_id = 'b'`); err != nil {
		t.Fatal(err)
	}

	// A reschedule far ahead (a) is left to the relay's next round; one due soon (b)
	// wakes the relay at commit; so does one far ahead of a task whose older version
	// is in Redis (b again), which the relay must replace before it falls due: it
	// keeps its queued_at, which makes the relay take it whatever its run_at.
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	soon := time.Now().Add(2 * time.Second).Truncate(time.Microsecond)
	for _, r := range []struct {
		id      string
		at      time.Time
		notify  bool
		version int
		queued  bool
	}{{"a", at, false, 2, false}, {"b", soon, true, 2, true}, {"b", at, true, 3, true}} {
		if err := b.client.Reschedule(ctx, b.pool, "q", r.id, r.at); err != nil {
			t.Fatalf("Reschedule %s: %v", r.id, err)
		}
		want := "q"
		if !r.notify {
			marker(t, b.pool, "after-"+r.id)
			want = "after-" + r.id
		}
		if got := nextNotification(t, l); got != want {
			t.Errorf("after Reschedule of %s to %v the listener heard %q, want %q", r.id, r.at, got, want)
		}
		s := load(t, b.pool, "q", r.id)
		if s.state != "pending" || !s.runAt.Equal(r.at) || s.vers != r.version || (s.queuedAt != nil) != r.queued {
			t.Errorf("after Reschedule, %s is %+v", r.id, s)
		}
	}

	if err := b.client.Cancel(ctx, b.pool, "q", "b"); err != nil {
		t.Fatal(err)
	}
	if s := load(t, b.pool, "q", "b"); s.state != "cancelled" || s.doneAt == nil || string(s.payload) != "p" {
		t.Errorf("after Cancel: %+v", s)
	}
	if err := b.client.Cancel(ctx, b.pool, "q", "b"); !errors.Is(err, outbox.ErrFinished) {
		t.Errorf("Cancel of a cancelled task: %v", err)
	}
	if err := b.client.Reschedule(ctx, b.pool, "q", "b", at); !errors.Is(err, outbox.ErrFinished) {
		t.Errorf("Reschedule of a cancelled task: %v", err)
	}
	if ok, err := b.client.MarkDone(ctx, b.pool, "q", "c", 1); err != nil || !ok {
		t.Fatalf("MarkDone = %v, %v", ok, err)
	}
	if err := b.client.Cancel(ctx, b.pool, "q", "c"); !errors.Is(err, outbox.ErrFinished) || !strings.Contains(err.Error(), "done") {
		t.Errorf("Cancel of a done task: %v", err)
	}
	if err := b.client.Cancel(ctx, b.pool, "q", "missing"); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("Cancel of a missing task: %v", err)
	}
	if err := b.client.Reschedule(ctx, b.pool, "q", "missing", at); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("Reschedule of a missing task: %v", err)
	}

	// A cancel in a transaction that rolls back leaves the task alone.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.client.Cancel(ctx, tx, "q", "a"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if s := load(t, b.pool, "q", "a"); s.state != "pending" {
		t.Errorf("after a rolled-back Cancel, a is %s", s.state)
	}
	// Nothing else was notified: not by Cancel, not by the failed calls.
	marker(t, b.pool, "end")
	if got := nextNotification(t, l); got != "end" {
		t.Errorf("unexpected notification %q", got)
	}
}

func TestCompletionGuard(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	for _, id := range []string{"ok", "dead", "moved"} {
		if _, err := b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "w", ID: id, Payload: []byte("secret")}); err != nil {
			t.Fatal(err)
		}
	}

	// A failed attempt: recorded, with a short, valid summary of the error.
	long := "boom\x00\xff " + strings.Repeat("é", 400)
	ok, err := b.client.RecordFailure(ctx, b.pool, "w", "ok", 1, 1, long, false)
	if err != nil || !ok {
		t.Fatalf("RecordFailure = %v, %v", ok, err)
	}
	s := load(t, b.pool, "w", "ok")
	if s.state != "pending" || s.attempt != 1 || s.lastError == nil {
		t.Fatalf("after RecordFailure: %+v", s)
	}
	if e := *s.lastError; len(e) > validate.MaxErrorBytes || !utf8.ValidString(e) || !strings.HasPrefix(e, "boom\ufffd ") ||
		!strings.HasSuffix(e, "…") {
		t.Errorf("last_error of %d bytes: %q", len(e), e)
	}

	// The wrong version changes nothing; the right one completes once.
	if ok, err := b.client.MarkDone(ctx, b.pool, "w", "ok", 2); err != nil || ok {
		t.Errorf("MarkDone at another version = %v, %v", ok, err)
	}
	if ok, err := b.client.MarkDone(ctx, b.pool, "w", "ok", 1); err != nil || !ok {
		t.Fatalf("MarkDone = %v, %v", ok, err)
	}
	if ok, err := b.client.MarkDone(ctx, b.pool, "w", "ok", 1); err != nil || ok {
		t.Errorf("second MarkDone = %v, %v", ok, err)
	}
	if ok, err := b.client.RecordFailure(ctx, b.pool, "w", "ok", 1, 2, "late", true); err != nil || ok {
		t.Errorf("RecordFailure after done = %v, %v", ok, err)
	}
	if s := load(t, b.pool, "w", "ok"); s.state != "done" || s.doneAt == nil || string(s.payload) != "secret" {
		t.Errorf("after MarkDone: %+v (payload kept by default)", s)
	}

	// Dead is terminal.
	if ok, err := b.client.RecordFailure(ctx, b.pool, "w", "dead", 1, 25, "gave up", true); err != nil || !ok {
		t.Fatalf("RecordFailure dead = %v, %v", ok, err)
	}
	if s := load(t, b.pool, "w", "dead"); s.state != "dead" || s.doneAt == nil || s.attempt != 25 || *s.lastError != "gave up" {
		t.Errorf("after dead: %+v", s)
	}
	if ok, err := b.client.MarkDone(ctx, b.pool, "w", "dead", 1); err != nil || ok {
		t.Errorf("MarkDone of a dead task = %v, %v", ok, err)
	}

	// A worker holding the version from before a reschedule cannot complete it.
	if err := b.client.Reschedule(ctx, b.pool, "w", "moved", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.client.MarkDone(ctx, b.pool, "w", "moved", 1); err != nil || ok {
		t.Errorf("MarkDone with the version before Reschedule = %v, %v", ok, err)
	}
	if ok, err := b.client.MarkDone(ctx, b.pool, "w", "moved", 2); err != nil || !ok {
		t.Errorf("MarkDone with the new version = %v, %v", ok, err)
	}
}

func TestClearPayloadOnDone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	c := newClient(t, outbox.Config{ClearPayloadOnDone: true})
	for _, id := range []string{"done", "cancelled", "dead"} {
		if _, err := c.Enqueue(ctx, b.pool, outbox.Task{Queue: "s", ID: id, Payload: []byte("card 4242")}); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := c.MarkDone(ctx, b.pool, "s", "done", 1); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := c.Cancel(ctx, b.pool, "s", "cancelled"); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.RecordFailure(ctx, b.pool, "s", "dead", 1, 3, "x", true); err != nil || !ok {
		t.Fatal(ok, err)
	}
	for id, want := range map[string]string{"done": "", "cancelled": "", "dead": "card 4242"} {
		if s := load(t, b.pool, "s", id); string(s.payload) != want {
			t.Errorf("%s: payload %q, want %q", id, s.payload, want)
		}
	}
}

func TestCustomSchema(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := testenv.EmptyPostgresURL(t)
	db, err := migrations.OpenDB(url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := migrations.Up(ctx, db, migrations.Config{Schema: "jobs"}); err != nil {
		t.Fatal(err)
	}
	pool := testenv.Pool(t, url)
	c := newClient(t, outbox.Config{Schema: "jobs"})
	if c.Table() != `"jobs"."delayq_outbox"` {
		t.Errorf("Table() = %s", c.Table())
	}
	if _, err := c.Enqueue(ctx, pool, outbox.Task{Queue: "q", ID: "1"}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM jobs.delayq_outbox`).Scan(&n); err != nil || n != 1 {
		t.Errorf("jobs.delayq_outbox has %d rows, %v", n, err)
	}
	// A client of another schema fails loudly rather than writing elsewhere.
	if _, err := newClient(t, outbox.Config{}).Enqueue(ctx, pool, outbox.Task{Queue: "q", ID: "2"}); err == nil {
		t.Error("enqueue into the unmigrated public schema succeeded")
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []outbox.Config{
		{Schema: "Jobs"},
		{Schema: "1jobs"},
		{Schema: `x"; drop table y; --`},
		{NotifyChannel: "a-b"},
		{NotifyChannel: strings.Repeat("c", 64)},
		{MaxPayloadBytes: -2},
		{DefaultMaxAttempts: -1},
	} {
		if _, err := outbox.New(cfg); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
	c := newClient(t, outbox.Config{MaxPayloadBytes: -1})
	if err := c.Validate(outbox.Task{Queue: "q", ID: "i", Payload: make([]byte, 1<<20)}); err != nil {
		t.Errorf("no limit: %v", err)
	}
	d := newClient(t, outbox.Config{}).Config()
	if d.Schema != "public" || d.MaxPayloadBytes != 64<<10 || d.DefaultMaxAttempts != 25 ||
		d.NotifyChannel != "delayq_outbox" || d.ClearPayloadOnDone {
		t.Errorf("defaults: %+v", d)
	}
}

// TestMarkDoneMany: the guard for many tasks at once marks exactly the pending or
// queued rows at the given version, and reports which.
func TestMarkDoneMany(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	for _, id := range []string{"a", "b", "c", "d"} {
		if _, err := b.client.Enqueue(ctx, b.pool, outbox.Task{Queue: "m", ID: id, Payload: []byte("p")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.client.Cancel(ctx, b.pool, "m", "c"); err != nil {
		t.Fatal(err)
	}
	keys := []taskstate.Key{{Queue: "m", ID: "a", Version: 1}, {Queue: "m", ID: "b", Version: 2}, {Queue: "m", ID: "c", Version: 1}, {Queue: "m", ID: "d", Version: 1}, {Queue: "m", ID: "missing", Version: 1}}
	applied, err := b.client.MarkDoneMany(ctx, b.pool, keys)
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, false, false, true, false}; !slices.Equal(applied, want) {
		t.Fatalf("applied %v, want %v (b: wrong version, c: cancelled, missing)", applied, want)
	}
	for id, want := range map[string]string{"a": "done", "b": "pending", "c": "cancelled", "d": "done"} {
		if s := load(t, b.pool, "m", id); s.state != want {
			t.Errorf("%s is %s, want %s", id, s.state, want)
		}
	}
	again, err := b.client.MarkDoneMany(ctx, b.pool, keys[:1])
	if err != nil || again[0] {
		t.Fatalf("second MarkDoneMany of a: %v %v, want false", again, err)
	}
	if _, err := b.client.MarkDoneMany(ctx, b.pool, []taskstate.Key{{Queue: "m", ID: "a", Version: 0}}); !errors.Is(err, taskstate.ErrInvalidArgument) {
		t.Fatalf("version 0: %v", err)
	}
}
