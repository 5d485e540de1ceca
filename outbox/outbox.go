package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/internal/notmigrated"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/transition"
	"github.com/delayq/delayq/internal/validate"
)

// Defaults of Config, as its fields' comments state them.
const (
	defaultNotifyWithin   = 30 * time.Second
	defaultNotifyCooldown = 25 * time.Millisecond
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

// DB is a database whose connections a long-running part holds (the relay's
// rounds, LISTEN and advisory lock; the worker's transactional handlers):
// *pgxpool.Pool satisfies it, and so does a wrapper of one (instrumented, say).
// Calls that run in the caller's transaction take a Querier instead.
type DB interface {
	Querier
	Begin(ctx context.Context) (pgx.Tx, error)
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

var _ DB = (*pgxpool.Pool)(nil)

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
	// MaxPayloadBytes is the largest payload Enqueue accepts. Default 64 KiB; at
	// most, and -1 means, the hard limit of 16 MiB, which the relay moves to Redis
	// whatever the Redis side's
	// own setting. Every payload travels through Redis: keep them small, pass
	// references to big data.
	MaxPayloadBytes int
	// DefaultMaxAttempts is used for tasks that leave MaxAttempts at 0. Default 25;
	// 1..1,000,000.
	DefaultMaxAttempts int
	// NotifyChannel is the Postgres notification channel the enqueue wakes the relay on,
	// with the queue name as payload. Default "delayq_outbox"; the
	// relay must listen on the same. 1..63 bytes of [a-z0-9_].
	NotifyChannel string
	// NotifyWithin: an enqueue (or reschedule) wakes the relay at commit only for
	// tasks due within this time. A task due later is found by the relay's next
	// round (at least every relay PollInterval, 5s by default) long before it falls
	// due. The reason: Postgres serializes the commits of every transaction that
	// sent a NOTIFY, so a notification per enqueue caps producers at one commit per
	// disk flush instead of sharing flushes (group commit). Keep it above the
	// relay's PollInterval. Default 30s; -1 notifies for every
	// task.
	NotifyWithin time.Duration
	// NotifyCooldown: an Enqueue of a task due within NotifyWithin leaves its
	// notification out when an earlier Enqueue of the same Client, into the same
	// queue, sent its own less than NotifyCooldown before and its transaction has
	// committed: the relay woke at that commit and keeps running rounds for its
	// FollowUpFor (100ms by default) after, which move this task as well. Postgres
	// serializes the commits of notifying transactions (one disk flush each, no
	// group commit), so near-due producers otherwise run slower than due-later
	// ones. The check is part of the enqueue's statement (no round trip): the
	// earlier enqueue's row must be visible to it, that is committed, savepoint
	// included; when it is still in progress, rolled back, or in another
	// database, the enqueue notifies. Such an enqueue's transaction notifies at
	// its commit after all when that commit comes 25ms or more after the
	// transaction began, too late for the follow-up rounds (migration 00015's
	// trigger). Keep FollowUpFor at least NotifyCooldown + 25ms plus a round.
	// EnqueueMany, Reschedule and dead retries notify at every commit. Default
	// 25ms; -1 notifies at every commit.
	NotifyCooldown time.Duration
	// ClearPayloadOnDone empties the payload of a task when it is marked done or is
	// cancelled, for payloads holding data that should not outlive the task. Dead tasks
	// keep theirs, since a person may run them again. Default false.
	ClearPayloadOnDone bool
	// TraceContext, when set, is called at every enqueue of a task that sets no
	// Task.TraceContext, with the enqueue's context: what it returns (a W3C
	// traceparent, say: package delayqotel's TraceContext) is stored with the task
	// and handed to its worker, so that the run continues the enqueue's trace. A
	// result that is not a valid trace context (see Task.TraceContext) is dropped,
	// never an error. Default nil: none.
	TraceContext func(ctx context.Context) string
}

// withDefaults returns a copy of c with every zero field set to its default;
// Client.Config returns the Config in use so.
func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = taskstate.DefaultSchema
	}
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = validate.DefaultMaxPayloadBytes
	}
	if c.DefaultMaxAttempts == 0 {
		c.DefaultMaxAttempts = validate.DefaultMaxAttempts
	}
	if c.NotifyChannel == "" {
		c.NotifyChannel = taskstate.DefaultNotifyChannel
	}
	if c.NotifyWithin == 0 {
		c.NotifyWithin = defaultNotifyWithin
	}
	if c.NotifyCooldown == 0 {
		c.NotifyCooldown = defaultNotifyCooldown
	}
	if c.MaxPayloadBytes == -1 {
		c.MaxPayloadBytes = validate.MaxPayloadBytes
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
	if c.NotifyCooldown < 0 && c.NotifyCooldown != -1 {
		return fmt.Errorf("%w: NotifyCooldown %v: positive, or -1 to notify at every commit", ErrInvalidConfig, c.NotifyCooldown)
	}
	if !plainIdent(c.NotifyChannel, true) {
		return fmt.Errorf("%w: NotifyChannel %q must be 1..63 bytes of [a-z0-9_]", ErrInvalidConfig, c.NotifyChannel)
	}
	if c.MaxPayloadBytes < -1 || c.MaxPayloadBytes > validate.MaxPayloadBytes {
		return fmt.Errorf("%w: MaxPayloadBytes %d: 1..%d, or -1 for the hard limit", ErrInvalidConfig, c.MaxPayloadBytes, validate.MaxPayloadBytes)
	}
	if c.DefaultMaxAttempts < 1 || c.DefaultMaxAttempts > validate.MaxAttempts {
		return fmt.Errorf("%w: DefaultMaxAttempts %d: 1..%d", ErrInvalidConfig, c.DefaultMaxAttempts, validate.MaxAttempts)
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

// Client enqueues tasks into the outbox and manages them. It holds no connection and is
// safe for concurrent use: every call takes the Querier to run on.
type Client struct {
	cfg       Config
	store     *taskstate.Store
	sql       taskstate.Statements
	ops       *transition.Ops // the producer's transitions after the insert (Postgres only)
	notifiers *notifiers      // nil when NotifyCooldown is -1
	// payloadTypes is each queue's payload type, as typed Queues enqueued
	// through c (strict.go).
	payloadTypes payloadTypes
}

// New returns a Client for the outbox described by cfg.
func New(cfg Config) (*Client, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	store := taskstate.New(taskstate.Config{
		Schema: cfg.Schema, NotifyChannel: cfg.NotifyChannel,
		NotifyWithin: cfg.NotifyWithin, ClearPayloadOnDone: cfg.ClearPayloadOnDone,
	})
	return &Client{cfg: cfg, store: store, sql: store.SQL, ops: transition.New(store, nil), notifiers: newNotifiers(cfg.NotifyCooldown)}, nil
}

// table returns the quoted, schema-qualified outbox table name, e.g.
// "public"."delayq_outbox".
func (c *Client) table() string { return c.store.Table() }

// CheckMigrated reports ErrNotMigrated, naming the table, when the outbox table
// of c's schema does not exist on q; nil when it does; and any other error as it
// is (a server that cannot be reached says nothing about the migrations).
func (c *Client) CheckMigrated(ctx context.Context, q Querier) error {
	var found bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, c.table()).Scan(&found); err != nil {
		return fmt.Errorf("outbox: look for the table %s: %w", c.table(), err)
	}
	if !found {
		return fmt.Errorf("outbox: %w", notmigrated.Table(c.table()))
	}
	return nil
}

// Config returns the configuration in use, defaults filled in.
func (c *Client) Config() Config { return c.cfg }
