package outbox

import (
	"time"

	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// TableName is the outbox table, created by package migrations.
	TableName = "delayq_outbox"
	// DefaultSchema is the schema used when Config.Schema is empty.
	DefaultSchema = "public"
	// DefaultMaxPayloadBytes is the payload limit used when Config.MaxPayloadBytes is 0.
	DefaultMaxPayloadBytes = 64 << 10
	// DefaultMaxAttempts is used when neither the task nor Config sets max attempts.
	DefaultMaxAttempts = 25
	// DefaultNotifyChannel is the channel the enqueue notifies and the relay listens on.
	DefaultNotifyChannel = "delayq_outbox"
	// DefaultNotifyWithin is how soon a task must be due for its enqueue to wake the
	// relay at commit.
	DefaultNotifyWithin = 30 * time.Second
	// MaxErrorBytes bounds the error summary RecordFailure stores.
	MaxErrorBytes = 500
)

// Querier runs SQL. pgx.Tx, *pgxpool.Pool, *pgxpool.Conn and *pgx.Conn satisfy it. Pass
// the caller's transaction to enqueue atomically with the caller's own writes; a pool or
// a connection outside a transaction commits each call by itself.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var (
	_ Querier = pgx.Tx(nil)
	_ Querier = (*pgx.Conn)(nil)
	_ Querier = (*pgxpool.Pool)(nil)
	_ Querier = (*pgxpool.Conn)(nil)
	_ Querier = (*pgxpool.Tx)(nil)
)

// SQLQuerier is the database/sql side: *sql.Tx, *sql.DB and *sql.Conn satisfy it, and so
// do sqlx's Tx and GORM's ConnPool (tx.Statement.ConnPool inside a GORM transaction). The
// *sql.DB must use the pgx driver (github.com/jackc/pgx/v5/stdlib) for EnqueueManySQL,
// which sends arrays; EnqueueSQL sends only plain values.
type SQLQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

var (
	_ SQLQuerier = (*sql.Tx)(nil)
	_ SQLQuerier = (*sql.DB)(nil)
	_ SQLQuerier = (*sql.Conn)(nil)
)

// Config configures a Client. The zero value is valid and means every default.
type Config struct {
	// Schema holds the outbox table; it must be the schema given to package migrations.
	// Default "public". A plain lower-case identifier: 1..63 bytes of [a-z0-9_], not
	// starting with a digit.
	Schema string
	// MaxPayloadBytes is the largest payload Enqueue accepts. Default 64 KiB
	// (DefaultMaxPayloadBytes); -1 means no limit of ours (Postgres stops at 1 GB, but
	// every payload also travels through Redis: keep them small, pass references to big
	// data).
	MaxPayloadBytes int
	// DefaultMaxAttempts is used for tasks that leave MaxAttempts at 0. Default 25
	// (DefaultMaxAttempts).
	DefaultMaxAttempts int
	// NotifyChannel is the Postgres notification channel the enqueue wakes the relay on,
	// with the queue name as payload. Default "delayq_outbox" (DefaultNotifyChannel); the
	// relay must listen on the same. 1..63 bytes of [a-z0-9_].
	NotifyChannel string
	// NotifyWithin: an enqueue (or reschedule) wakes the relay at commit only for
	// tasks due within this time. A task due later is found by the relay's next
	// round (at least every relay PollInterval, 5s by default) long before it falls
	// due. The reason: Postgres serializes the commits of every transaction that
	// sent a NOTIFY, so a notification per enqueue caps producers at one commit per
	// disk flush instead of sharing flushes (group commit). Keep it above the
	// relay's PollInterval. Default 30s (DefaultNotifyWithin); -1 notifies for every
	// task.
	NotifyWithin time.Duration
	// ClearPayloadOnDone empties the payload of a task when it is marked done or is
	// cancelled, for payloads holding data that should not outlive the task. Dead tasks
	// keep theirs, since a person may run them again. Default false.
	ClearPayloadOnDone bool
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if c.DefaultMaxAttempts == 0 {
		c.DefaultMaxAttempts = DefaultMaxAttempts
	}
	if c.NotifyChannel == "" {
		c.NotifyChannel = DefaultNotifyChannel
	}
	if c.NotifyWithin == 0 {
		c.NotifyWithin = DefaultNotifyWithin
	}
	return c
}

func (c Config) validate() error {
	if !plainIdent(c.Schema, false) {
		return fmt.Errorf("%w: Schema %q must be 1..63 bytes of [a-z0-9_], not starting with a digit",
			ErrInvalidConfig, c.Schema)
	}
	if c.NotifyWithin < 0 && c.NotifyWithin != -1 {
		return fmt.Errorf("%w: NotifyWithin %v: positive, or -1 for every task", ErrInvalidConfig, c.NotifyWithin)
	}
	if !plainIdent(c.NotifyChannel, true) {
		return fmt.Errorf("%w: NotifyChannel %q must be 1..63 bytes of [a-z0-9_]", ErrInvalidConfig, c.NotifyChannel)
	}
	if c.MaxPayloadBytes < -1 {
		return fmt.Errorf("%w: MaxPayloadBytes %d (use -1 for no limit)", ErrInvalidConfig, c.MaxPayloadBytes)
	}
	if c.DefaultMaxAttempts < 1 || c.DefaultMaxAttempts > maxInt32 {
		return fmt.Errorf("%w: DefaultMaxAttempts %d must be at least 1", ErrInvalidConfig, c.DefaultMaxAttempts)
	}
	return nil
}

// plainIdent reports whether s is 1..63 bytes of [a-z0-9_]; a leading digit only if
// digitFirst. Such a name reads the same quoted or not and is safe to splice into SQL.
func plainIdent(s string, digitFirst bool) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c == '_' || c >= '0' && c <= '9' && (i > 0 || digitFirst) {
			continue
		}
		return false
	}
	return true
}

const maxInt32 = 1<<31 - 1

// Client enqueues tasks into the outbox and manages them. It holds no connection and is
// safe for concurrent use: every call takes the Querier to run on.
type Client struct {
	cfg   Config
	table string
	sql   statements
}

// New returns a Client for the outbox described by cfg.
func New(cfg Config) (*Client, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	table := fmt.Sprintf(`"%s"."%s"`, cfg.Schema, TableName)
	return &Client{cfg: cfg, table: table, sql: newStatements(table, cfg)}, nil
}

// Table returns the quoted, schema-qualified outbox table name, e.g.
// "public"."delayq_outbox", for SQL written by other packages.
func (c *Client) Table() string { return c.table }

// Config returns the configuration in use, defaults filled in.
func (c *Client) Config() Config { return c.cfg }
