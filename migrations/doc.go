// Package migrations creates and upgrades the Postgres schema of delayq: the outbox
// table delayq_outbox and its indexes.
//
// The migrations are goose v3 SQL files embedded in the binary, so the library and the
// delayq command migrate a database without any file on disk. They are applied through
// goose's Provider API on a *sql.DB; [OpenDB] and [OpenDBFromPool] make one with the pgx
// driver.
//
//	db, err := migrations.OpenDB(os.Getenv("DATABASE_URL"))
//	...
//	defer db.Close()
//	m, err := migrations.New(db, migrations.Config{Schema: "jobs"})
//	...
//	applied, err := m.Up(ctx)
//
// # Schema
//
// Everything delayq creates lives in one schema, [Config.Schema] ("public" by default):
// the table delayq_outbox with its indexes, and goose's version table delayq_goose_version. The
// schema is created by Up when it does not exist, and is never dropped by Down. The
// migration files name the schema explicitly, so the *sql.DB may use any search_path.
// The version table has a name of its own, so a service that runs its own goose
// migrations in the same schema keeps its goose_db_version untouched.
//
// # Concurrency
//
// Up and Down take a Postgres advisory lock (one per schema) for their whole run, so
// several processes starting at once (relays, workers, a deploy job) migrate once and the
// others wait, then find nothing to do.
package migrations
