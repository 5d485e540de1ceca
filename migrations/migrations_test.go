package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/migrations"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// openDB opens a *sql.DB on url, closed when the test ends.
func openDB(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := migrations.OpenDB(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func newMigrator(t *testing.T, db *sql.DB, cfg migrations.Config) *migrations.Migrator {
	t.Helper()
	m, err := migrations.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// regclass returns whether the qualified relation exists.
func regclass(t *testing.T, db *sql.DB, name string) bool {
	t.Helper()
	var ok bool
	if err := db.QueryRowContext(t.Context(), `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func schemaExists(t *testing.T, db *sql.DB, name string) bool {
	t.Helper()
	var ok bool
	err := db.QueryRowContext(t.Context(),
		`SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, name).Scan(&ok)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func names(rs []migrations.Result) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Direction+" "+r.Name)
	}
	return out
}

func TestUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openDB(t, testenv.EmptyPostgresURL(t))
	m := newMigrator(t, db, migrations.Config{})

	cur, latest, err := m.Version(ctx)
	if err != nil || cur != 0 || latest < 1 {
		t.Fatalf("Version on an empty database = %d, %d, %v; want 0, >=1, nil", cur, latest, err)
	}
	st, err := m.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) == 0 {
		t.Fatal("Status lists no migration")
	}
	for _, s := range st {
		if s.Applied {
			t.Errorf("%s applied on an empty database", s.Name)
		}
	}

	up := func(want int) {
		t.Helper()
		res, err := m.Up(ctx)
		if err != nil {
			t.Fatalf("Up: %v", err)
		}
		if len(res) != want {
			t.Fatalf("Up applied %v, want %d migrations", names(res), want)
		}
		if !regclass(t, db, "public.delayq_outbox") {
			t.Fatal("after Up, public.delayq_outbox does not exist")
		}
		if cur, latest, err := m.Version(ctx); err != nil || cur != latest {
			t.Fatalf("after Up, Version = %d, %d, %v; want equal", cur, latest, err)
		}
		// The table accepts a row, and its checks refuse a bad state.
		if _, err := db.ExecContext(ctx, `INSERT INTO public.delayq_outbox
			(queue, task_id, run_at, payload, max_attempts) VALUES ('q', 'a', now(), '', 1)
			ON CONFLICT DO NOTHING`); err != nil {
			t.Fatalf("insert after Up: %v", err)
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO public.delayq_outbox
			(queue, task_id, run_at, payload, max_attempts, state) VALUES ('q', 'b', now(), '', 1, 'bogus')`); err == nil {
			t.Fatal("a row with state 'bogus' was accepted")
		}
	}

	up(len(st))
	up(0) // nothing left to do
	st, err = m.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if !s.Applied || s.AppliedAt.IsZero() {
			t.Errorf("after Up: %+v", s)
		}
	}
	// goose's default version table is left to the application's own migrations.
	if regclass(t, db, "public.goose_db_version") {
		t.Error("public.goose_db_version exists; delayq must use its own version table")
	}
	if !regclass(t, db, "public."+migrations.VersionTable) {
		t.Errorf("public.%s does not exist", migrations.VersionTable)
	}

	down, err := m.DownTo(ctx, 0)
	if err != nil {
		t.Fatalf("DownTo(0): %v", err)
	}
	if len(down) != len(st) {
		t.Fatalf("DownTo(0) rolled back %v, want %d", names(down), len(st))
	}
	if regclass(t, db, "public.delayq_outbox") {
		t.Fatal("after DownTo(0), public.delayq_outbox still exists")
	}
	if res, err := m.Down(ctx); err != nil || len(res) != 0 {
		t.Fatalf("Down with nothing applied = %v, %v; want nothing, nil", names(res), err)
	}
	if cur, _, err := m.Version(ctx); err != nil || cur != 0 {
		t.Fatalf("after DownTo(0), Version = %d, %v", cur, err)
	}

	up(len(st)) // the table comes back empty: the old rows went with it
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM public.delayq_outbox`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows after up, down, up = %d, %v; want 1 (the one inserted by the last up)", n, err)
	}
}

func TestCustomSchema(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openDB(t, testenv.EmptyPostgresURL(t))
	m := newMigrator(t, db, migrations.Config{Schema: "tenant_a"})

	// Read-only calls do not create the schema.
	if cur, _, err := m.Version(ctx); err != nil || cur != 0 {
		t.Fatalf("Version = %d, %v", cur, err)
	}
	if st, err := m.Status(ctx); err != nil || len(st) == 0 || st[0].Applied {
		t.Fatalf("Status = %+v, %v", st, err)
	}
	if res, err := m.Down(ctx); err != nil || len(res) != 0 {
		t.Fatalf("Down = %v, %v", names(res), err)
	}
	if schemaExists(t, db, "tenant_a") {
		t.Fatal("Version/Status/Down created the schema")
	}

	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"tenant_a.delayq_outbox":                    true,
		"tenant_a." + migrations.VersionTable:       true,
		"tenant_a.delayq_outbox_pending_run_at_idx": true,
		"public.delayq_outbox":                      false,
		"public." + migrations.VersionTable:         false,
	} {
		if got := regclass(t, db, name); got != want {
			t.Errorf("%s exists: %v, want %v", name, got, want)
		}
	}

	// A second schema in the same database is independent of the first.
	other := newMigrator(t, db, migrations.Config{Schema: "tenant_b"})
	if res, err := other.Up(ctx); err != nil || len(res) == 0 {
		t.Fatalf("Up of tenant_b = %v, %v", names(res), err)
	}

	if _, err := m.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if regclass(t, db, "tenant_a.delayq_outbox") {
		t.Error("tenant_a.delayq_outbox survived DownTo(0)")
	}
	if !schemaExists(t, db, "tenant_a") {
		t.Error("DownTo(0) dropped the schema; it may hold the user's own tables")
	}
	if !regclass(t, db, "tenant_b.delayq_outbox") {
		t.Error("rolling back tenant_a touched tenant_b")
	}
}

// Processes that start together (relays, workers) may all migrate at once: one applies,
// the others wait for the lock and find nothing to do.
func TestConcurrentUp(t *testing.T) {
	t.Parallel()
	url := testenv.EmptyPostgresURL(t)
	const n = 4
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied int
		errs    []error
	)
	for range n {
		db := openDB(t, url) // one pool each, as separate processes would have
		m := newMigrator(t, db, migrations.Config{Schema: "jobs"})
		wg.Go(func() {
			res, err := m.Up(t.Context())
			mu.Lock()
			defer mu.Unlock()
			applied += len(res)
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("concurrent Up failed: %v", errors.Join(errs...))
	}
	db := openDB(t, url)
	st, err := newMigrator(t, db, migrations.Config{Schema: "jobs"}).Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if applied != len(st) {
		t.Fatalf("%d concurrent Up calls applied %d migrations in all, want %d", n, applied, len(st))
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	db, err := migrations.OpenDB("postgres://user:secret@127.0.0.1:1/none") // never connected
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, tc := range []struct {
		name string
		cfg  migrations.Config
		want error
	}{
		{"upper case", migrations.Config{Schema: "Public"}, migrations.ErrInvalidSchema},
		{"leading digit", migrations.Config{Schema: "1jobs"}, migrations.ErrInvalidSchema},
		{"dash", migrations.Config{Schema: "my-jobs"}, migrations.ErrInvalidSchema},
		{"quote", migrations.Config{Schema: `a"; DROP TABLE x; --`}, migrations.ErrInvalidSchema},
		{"dot", migrations.Config{Schema: "a.b"}, migrations.ErrInvalidSchema},
		{"too long", migrations.Config{Schema: strings.Repeat("a", 64)}, migrations.ErrInvalidSchema},
		{"negative lock timeout", migrations.Config{LockTimeout: -time.Second}, migrations.ErrInvalidConfig},
	} {
		if _, err := migrations.New(db, tc.cfg); !errors.Is(err, tc.want) {
			t.Errorf("%s: New = %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := migrations.New(nil, migrations.Config{}); !errors.Is(err, migrations.ErrInvalidConfig) {
		t.Errorf("New(nil) = %v, want ErrInvalidConfig", err)
	}
	if _, err := migrations.New(db, migrations.Config{Schema: strings.Repeat("a", 63)}); err != nil {
		t.Errorf("63-byte schema: %v", err)
	}
	if _, err := migrations.OpenDB("postgres://user:secret@host:notaport/db"); err == nil ||
		strings.Contains(err.Error(), "secret") {
		t.Errorf("OpenDB with a bad URL = %v; want an error without the password", err)
	}
}

// The relay's scan of due pending rows must use the partial index, whatever the number
// of finished rows; with a backlog (more due rows than the batch) it must read the index
// in run_at order and stop at the limit, with no sort.
func TestRelayScanUsesIndex(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testenv.Postgres(t)
	// 50,000 rows, as a table looks after a while: almost all finished, 1,000 pending,
	// due over the next hour.
	_, err := pool.Exec(ctx, `
		INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts, state, done_at)
		SELECT 'payment', 'order-' || i, now() + (i % 3600) * interval '1 second', '\x00',
		       25, CASE WHEN i % 50 = 0 THEN 'pending' ELSE 'done' END,
		       CASE WHEN i % 50 = 0 THEN NULL ELSE now() END
		FROM generate_series(1, 50000) AS i`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE delayq_outbox`); err != nil {
		t.Fatal(err)
	}
	explain := func(horizon time.Duration, limit int) string {
		t.Helper()
		rows, err := pool.Query(ctx, `EXPLAIN
			SELECT queue, task_id, run_at, payload, attempt, max_attempts, version
			FROM delayq_outbox
			WHERE state = 'pending' AND run_at < $1
			ORDER BY run_at
			LIMIT $2
			FOR UPDATE SKIP LOCKED`, time.Now().Add(horizon), limit)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		text := strings.Join(plan, "\n")
		t.Logf("plan, horizon %v, limit %d:\n%s", horizon, limit, text)
		if !strings.Contains(text, "Index Scan on delayq_outbox_pending_run_at_idx") &&
			!strings.Contains(text, "Index Scan using delayq_outbox_pending_run_at_idx") {
			t.Error("the relay's scan does not use delayq_outbox_pending_run_at_idx")
		}
		if strings.Contains(text, "Seq Scan") {
			t.Error("the relay's scan reads the whole table")
		}
		return text
	}

	// Backlog: all 1,000 pending rows are due, the batch takes 100.
	if plan := explain(2*time.Hour, 100); !strings.Contains(plan, "Index Scan using delayq_outbox_pending_run_at_idx") ||
		strings.Contains(plan, "Sort") {
		t.Error("with a backlog the scan must read the index in run_at order, without a sort")
	}
	// Few due rows (about 170 in the next ten minutes), a batch larger than that.
	explain(10*time.Minute, 500)
}

// A pending row with a 20-byte payload must cost at most 300 bytes, heap and indexes.
func TestRowSize(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testenv.Postgres(t)
	const n = 20000
	// Ids in random order, as many producers make them: the primary key splits pages
	// in the middle, the less compact case.
	_, err := pool.Exec(ctx, `
		INSERT INTO delayq_outbox (queue, task_id, run_at, payload, max_attempts)
		SELECT 'payment', 'order-' || lpad(i::text, 7, '0'),
		       now() + random() * interval '1 day', '\x0102030405060708090a0b0c0d0e0f1011121314', 25
		FROM generate_series(1, $1::int) AS i ORDER BY random()`, n)
	if err != nil {
		t.Fatal(err)
	}
	var heap, total int64
	err = pool.QueryRow(ctx, `SELECT pg_relation_size('delayq_outbox'), pg_total_relation_size('delayq_outbox')`).
		Scan(&heap, &total)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d pending rows: heap %d B/row, heap+indexes %d B/row", n, heap/n, total/n)
	if total/n > 300 {
		t.Errorf("a pending row takes %d B with its indexes, budget 300 B", total/n)
	}

	// Once relayed, a row is in the index of queued rows, keyed on its queue alone:
	// deduplicated, a few bytes a row (keyed on the task id too, it took 67 B).
	if _, err := pool.Exec(ctx, `UPDATE delayq_outbox SET state = 'queued', queued_at = now()`); err != nil {
		t.Fatal(err)
	}
	var queuedIdx int64
	if err := pool.QueryRow(ctx, `SELECT pg_relation_size('delayq_outbox_queued_idx')`).Scan(&queuedIdx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d queued rows: queued index %d B/row", n, queuedIdx/n)
	if queuedIdx/n > 16 {
		t.Errorf("the index of queued rows takes %d B a row, want at most 16", queuedIdx/n)
	}

	// The hook-pending mark (00016) is NULL in live rows: its partial index holds
	// none of them (its metapage and an empty root: 2 pages at most).
	var hookIdx int64
	if err := pool.QueryRow(ctx, `SELECT pg_relation_size('delayq_outbox_hook_due_idx')`).Scan(&hookIdx); err != nil {
		t.Fatal(err)
	}
	if hookIdx > 2*8192 {
		t.Errorf("the index of hook-pending marks takes %d B with no row marked", hookIdx)
	}
}

// TestNotifyLateFunction (00017): the late-commit trigger's function measures the
// transaction's age by transaction_timestamp() and reads the row only to notify;
// DownTo(16) gives back 00015's, which read created_at, and a late commit of a
// marked row notifies with either (the behaviour is TestLateCommitNotifies's, in
// package outbox, and the relay's notify tests).
func TestNotifyLateFunction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := testenv.EmptyPostgresURL(t)
	db := openDB(t, url)
	m := newMigrator(t, db, migrations.Config{})
	body := func() string {
		t.Helper()
		var def string
		if err := db.QueryRowContext(ctx, `SELECT pg_get_functiondef('public.delayq_outbox_notify_late()'::regprocedure)`).Scan(&def); err != nil {
			t.Fatal(err)
		}
		return def
	}
	listener, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(context.Background()) //nolint:errcheck
	if _, err := listener.Exec(ctx, `LISTEN late_fn`); err != nil {
		t.Fatal(err)
	}
	// A marked row's commit, 25 ms or more after its transaction began, notifies.
	lateCommitNotifies := func() bool {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback() //nolint:errcheck // committed below
		if _, err := tx.ExecContext(ctx, `SELECT pg_sleep(0.03)`); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO public.delayq_outbox (queue, task_id, run_at, payload, max_attempts, notify_late)
			VALUES ('q', gen_random_uuid()::text, now(), '', 1, 'late_fn')`); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := listener.WaitForNotification(wctx)
		return err == nil && n.Payload == "q"
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if def := body(); !strings.Contains(def, "transaction_timestamp()") || strings.Contains(def, "created_at") {
		t.Fatalf("after Up, the function reads:\n%s\nwant transaction_timestamp() and no created_at", def)
	}
	if !lateCommitNotifies() {
		t.Fatal("after Up, a late commit of a marked row notified nothing")
	}
	if _, err := m.DownTo(ctx, 16); err != nil {
		t.Fatal(err)
	}
	if def := body(); !strings.Contains(def, "NEW.created_at") {
		t.Fatalf("after DownTo(16), the function reads:\n%s\nwant 00015's NEW.created_at", def)
	}
	if !lateCommitNotifies() {
		t.Fatal("after DownTo(16), a late commit of a marked row notified nothing")
	}
}
