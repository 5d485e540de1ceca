package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math"
	"path"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

const (
	// defaultSchema is the schema used when Config.Schema is empty.
	defaultSchema = "public"
	// tableName is the name of the outbox table inside the schema.
	tableName = "delayq_outbox"
	// versionTable is the name of goose's version table inside the schema. It is not
	// goose's default name, so that it never mixes with a service's own goose migrations.
	versionTable = "delayq_goose_version"
	// defaultLockTimeout is how long Up and Down wait for another migrator by default.
	defaultLockTimeout = 5 * time.Minute
)

// Config configures a Migrator. The zero value is valid and means every default.
type Config struct {
	// Schema holds the outbox table and the version table. Default "public".
	// Up creates it when it does not exist. It must be a plain
	// lower-case identifier: 1..63 bytes of [a-z0-9_], not starting with a digit.
	Schema string
	// Logger receives goose's progress messages (one per migration applied).
	// Default: nil, meaning nothing is logged.
	Logger *slog.Logger
	// LockTimeout bounds how long Up and Down wait for the advisory lock held by
	// another migrator of the same schema. Default 5 minutes; the
	// lock is polled once a second.
	LockTimeout time.Duration
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Schema == "" {
		c.Schema = defaultSchema
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = defaultLockTimeout
	}
	return c
}

// Validate reports whether c, with its defaults, is a valid configuration (New
// does the same), so a command can reject a bad schema name before it connects.
// The error wraps ErrInvalidSchema or ErrInvalidConfig.
func (c Config) Validate() error { return c.WithDefaults().validate() }

func (c Config) validate() error {
	if err := validateSchema(c.Schema); err != nil {
		return err
	}
	if c.LockTimeout < 0 {
		return fmt.Errorf("%w: LockTimeout %v is negative", ErrInvalidConfig, c.LockTimeout)
	}
	return nil
}

// validateSchema checks a schema name: 1..63 bytes of [a-z0-9_], not starting with a
// digit. Such a name means the same quoted or not, so it is safe to splice into SQL.
func validateSchema(s string) error {
	if s == "" {
		return fmt.Errorf("%w: empty", ErrInvalidSchema)
	}
	if len(s) > 63 {
		return fmt.Errorf("%w: %d bytes, at most 63", ErrInvalidSchema, len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c == '_' || i > 0 && c >= '0' && c <= '9' {
			continue
		}
		return fmt.Errorf("%w: %q has %q at byte %d; allowed are a-z, 0-9 (not first) and '_'",
			ErrInvalidSchema, s, c, i)
	}
	return nil
}

// Result describes one migration applied or rolled back.
type Result struct {
	Version   int64
	Name      string // file name, e.g. "00001_delayq_outbox.sql"
	Direction string // "up" or "down"
	Duration  time.Duration
}

// Status describes one known migration.
type Status struct {
	Version   int64
	Name      string
	Applied   bool
	AppliedAt time.Time // zero unless Applied
}

// Migrator applies the embedded migrations to one database and schema. It is safe for
// concurrent use; calls on one Migrator run one at a time.
type Migrator struct {
	db       *sql.DB
	schema   string
	provider *goose.Provider
}

// New returns a Migrator for db. It does not touch the database.
func New(db *sql.DB, cfg Config) (*Migrator, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil *sql.DB", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	fsys, err := render(cfg.Schema)
	if err != nil {
		return nil, err
	}
	id := lockID(cfg.Schema)
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(id),
		lock.WithLockTimeout(1, uint64(max(1, math.Ceil(cfg.LockTimeout.Seconds())))),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: session locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithTableName(cfg.Schema+"."+versionTable),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true), // Go migrations registered by the application are not ours
		goose.WithSlog(cfg.Logger),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: goose provider: %w", err)
	}
	return &Migrator{db: db, schema: cfg.Schema, provider: p}, nil
}

// lockID is the advisory lock key that serializes migrators of one schema.
func lockID(schema string) int64 {
	h := fnv.New64a()
	_, _ = io.WriteString(h, "delayq/migrations/"+schema)
	return int64(h.Sum64())
}

// Up creates the schema if needed and applies every pending migration. It returns the
// migrations it applied (none when the database is up to date). On failure it returns
// those applied before the failing one together with the error.
func (m *Migrator) Up(ctx context.Context) ([]Result, error) {
	if err := m.ensureSchema(ctx); err != nil {
		return nil, err
	}
	res, err := m.provider.Up(ctx)
	return results(res, err, "up")
}

// Down rolls back the latest applied migration, if any.
func (m *Migrator) Down(ctx context.Context) ([]Result, error) {
	if ok, err := m.schemaExists(ctx); err != nil || !ok {
		return nil, err
	}
	r, err := m.provider.Down(ctx)
	if errors.Is(err, goose.ErrNoNextVersion) {
		return nil, nil
	}
	var rs []*goose.MigrationResult
	if r != nil {
		rs = append(rs, r)
	}
	return results(rs, err, "down")
}

// DownTo rolls back every applied migration newer than version. DownTo(ctx, 0) removes
// everything delayq created except the schema and the version table.
func (m *Migrator) DownTo(ctx context.Context, version int64) ([]Result, error) {
	if version < 0 {
		return nil, fmt.Errorf("%w: version %d is negative", ErrInvalidConfig, version)
	}
	if ok, err := m.schemaExists(ctx); err != nil || !ok {
		return nil, err
	}
	res, err := m.provider.DownTo(ctx, version)
	return results(res, err, "down")
}

// Status lists every embedded migration in version order and whether it is applied.
// It creates goose's version table if the schema exists but the table does not.
func (m *Migrator) Status(ctx context.Context) ([]Status, error) {
	ok, err := m.schemaExists(ctx)
	if err != nil {
		return nil, err
	}
	if !ok {
		var out []Status
		for _, s := range m.provider.ListSources() {
			out = append(out, Status{Version: s.Version, Name: path.Base(s.Path)})
		}
		return out, nil
	}
	st, err := m.provider.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: status of schema %s: %w", m.schema, err)
	}
	out := make([]Status, 0, len(st))
	for _, s := range st {
		out = append(out, Status{
			Version:   s.Source.Version,
			Name:      path.Base(s.Source.Path),
			Applied:   s.State == goose.StateApplied,
			AppliedAt: s.AppliedAt,
		})
	}
	return out, nil
}

// Version returns the version the database is at (0: nothing applied) and the latest
// version embedded in this binary. They differ when Up has work to do.
func (m *Migrator) Version(ctx context.Context) (current, latest int64, err error) {
	for _, s := range m.provider.ListSources() {
		latest = max(latest, s.Version)
	}
	ok, err := m.schemaExists(ctx)
	if err != nil || !ok {
		return 0, latest, err
	}
	current, err = m.provider.GetDBVersion(ctx)
	if err != nil {
		return 0, latest, fmt.Errorf("migrations: version of schema %s: %w", m.schema, err)
	}
	return current, latest, nil
}

func (m *Migrator) schemaExists(ctx context.Context) (bool, error) {
	var ok bool
	err := m.db.QueryRowContext(ctx,
		`SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)`, m.schema).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("migrations: look up schema %s: %w", m.schema, err)
	}
	return ok, nil
}

// ensureSchema creates the schema when it is missing. Checking first means a role
// without CREATE on the database can still migrate inside an existing schema. Two
// migrators creating the same schema at once collide on pg_namespace's unique
// index: the loser finds the schema there and goes on. No lock is waited for
// here: a transaction waiting on the migrators' lock while the holder runs a
// CREATE INDEX CONCURRENTLY (which waits for every open transaction) would
// deadlock with it.
func (m *Migrator) ensureSchema(ctx context.Context) error {
	if ok, err := m.schemaExists(ctx); err != nil || ok {
		return err
	}
	// The name is validated: lower-case letters, digits and '_' only.
	_, err := m.db.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS `+m.schema)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "23505" || pe.Code == "42P06") {
		// unique_violation, duplicate_schema: another migrator created it.
		if ok, err2 := m.schemaExists(ctx); err2 == nil && ok {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("migrations: create schema %s: %w", m.schema, err)
	}
	return nil
}

func results(in []*goose.MigrationResult, err error, direction string) ([]Result, error) {
	var partial *goose.PartialError
	if errors.As(err, &partial) {
		in = partial.Applied
	}
	out := make([]Result, 0, len(in))
	for _, r := range in {
		if r == nil || r.Source == nil || r.Error != nil {
			continue
		}
		out = append(out, Result{
			Version:   r.Source.Version,
			Name:      path.Base(r.Source.Path),
			Direction: r.Direction,
			Duration:  r.Duration,
		})
	}
	if err != nil {
		return out, fmt.Errorf("migrations: %s: %w", direction, err)
	}
	return out, nil
}

// Up applies every pending migration to db with cfg; a shorthand for New then Up.
func Up(ctx context.Context, db *sql.DB, cfg Config) ([]Result, error) {
	m, err := New(db, cfg)
	if err != nil {
		return nil, err
	}
	return m.Up(ctx)
}

// OpenDB opens a *sql.DB on the pgx driver from a Postgres URL or key=value connection
// string. It does not connect; the first query does. Errors never contain the password.
func OpenDB(connString string) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		// pgx's message can quote a malformed string, password included.
		return nil, errors.New("migrations: malformed connection string (details withheld: it may contain a password)")
	}
	return stdlib.OpenDB(*cfg), nil
}

// OpenDBFromPool returns a *sql.DB that borrows its connections from pool. Closing it
// does not close the pool.
func OpenDBFromPool(pool *pgxpool.Pool) *sql.DB {
	return stdlib.OpenDBFromPool(pool)
}
