package delayq

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/migrations"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
	"github.com/delayq/delayq/schedule"
)

// Config configures a Client. The zero value means every default. The schema,
// the key prefix and the notification channel are named here once: the outbox,
// the worker, the relay and the operator calls all use them.
type Config struct {
	// Schema holds the outbox table (Migrate creates it there). Default
	// "public": a plain lower-case identifier, 1..63 bytes of [a-z0-9_].
	Schema string
	// Prefix starts every Redis key of this deployment. Default "dq"; 1..64
	// bytes of [A-Za-z0-9_.:-]. Workers, relays and the delayq command of one
	// deployment must use the same.
	Prefix string
	// NotifyChannel is the Postgres channel an enqueue wakes the relay on.
	// Default "delayq_outbox"; 1..63 bytes of [a-z0-9_].
	NotifyChannel string
	// Database names this client's outbox database when several databases feed
	// one Redis (docs/DESIGN.md, "Several databases"): a stable key, not a URL.
	// Its tasks live in Redis under Prefix + ":" + Database, so a task id is
	// unique per (database, queue, id); its handlers' guards and transactions run
	// on this client's pool; its metrics carry the label database=<key> and its
	// log lines the attribute database. A service on several databases makes a
	// Client for each, with the same handlers; each database has its relay.
	// Default "": one database, keys under Prefix. 1..32 bytes of [a-z0-9_-],
	// starting with a letter or a digit.
	Database string

	// Logger receives the worker's and the relay's state changes and errors,
	// unless Worker.Logger or Relay.Logger is set. Default: discard.
	Logger *slog.Logger
	// Registerer, when set, gets the worker's and the relay's Prometheus
	// collectors, unless Worker.Registerer or Relay.Registerer is set. Default
	// nil: no Prometheus metrics.
	Registerer prometheus.Registerer

	// Outbox sets the producer's limits and notification timing (see
	// outbox.Config). Leave its Schema and NotifyChannel empty: they come from
	// above.
	Outbox outbox.Config
	// Worker sets the leases, the shutdown and the middleware of the handlers
	// registered on this client (see WorkerConfig).
	Worker WorkerConfig
	// Relay, when set, makes Run run the relay in this process beside the
	// workers, with its periodic schedules (Relay.Schedules; schedules declared
	// on the client run whether it is set or not, see Client.Schedule): one
	// process for a small deployment. Leave its Schema and NotifyChannel empty. To scale, run
	// the relay as its own process (the `delayq relay` command) and leave this
	// nil. Default nil: no relay here.
	Relay *relay.Config
}

// Client is delayq for one service: it migrates the schema, enqueues in the
// caller's transaction (as the Producer of outbox.Queue's Enqueue), runs the
// registered handlers (and, with Config.Relay, the relay), and carries the
// operator's calls. Create it with New; it is safe for concurrent use.
type Client struct {
	pool outbox.DB
	rdb  redis.UniversalClient
	cfg  Config
	dq   *dispatch.Client
	ob   *outbox.Client
	w    *worker
	rl   *relay.Relay // nil without Config.Relay
	ctl  *queuectl.Controller

	mu        sync.Mutex
	running   bool
	schedules []schedule.Schedule // declared by Schedule, for Run
}

// New returns a Client on pool (the outbox's database: a *pgxpool.Pool, or a
// wrapper of one that is a DB) and rdb (Redis: a client, a cluster client or a
// failover client). It checks cfg and connects to nothing: the first call that
// needs a server does.
func New(pool outbox.DB, rdb redis.UniversalClient, cfg Config) (*Client, error) {
	if pool == nil || rdb == nil {
		return nil, fmt.Errorf("%w: New needs a pgx pool and a Redis client", ErrInvalidConfig)
	}
	cfg, err := cfg.resolve(rdb)
	if err != nil {
		return nil, err
	}
	c := &Client{pool: pool, rdb: rdb, cfg: cfg}
	// The module's own tools hand a Redis client bound to their dispatch client.
	if c.dq, err = dispatch.On(rdb, dispatch.Config{Prefix: dispatch.Namespace(cfg.Prefix, cfg.Database), Logger: cfg.Logger}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.ob, err = outbox.New(cfg.Outbox); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.w, err = newWorker(pool, c.dq, c.ob, cfg.Worker); err != nil {
		return nil, err
	}
	if cfg.Relay != nil {
		if c.rl, err = relay.New(pool, c.dq.AsRedis(), *cfg.Relay); err != nil {
			return nil, fmt.Errorf("%w: relay: %w", ErrInvalidConfig, err)
		}
	}
	if c.ctl, err = queuectl.New(pool, c.dq, cfg.Schema); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return c, nil
}

// resolve applies the defaults and hands the names given once to the parts.
func (c Config) resolve(rdb redis.UniversalClient) (Config, error) {
	if c.Schema == "" {
		c.Schema = taskstate.DefaultSchema
	}
	if b, ok := rdb.(dispatch.Bound); ok && c.Prefix == "" && c.Database == "" {
		c.Prefix = b.Client.Config().Prefix
	}
	if c.Prefix == "" {
		c.Prefix = dispatch.DefaultPrefix
	}
	if c.NotifyChannel == "" {
		c.NotifyChannel = taskstate.DefaultNotifyChannel
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := (migrations.Config{Schema: c.Schema}).Validate(); err != nil {
		return c, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	// The relay adds the database to its own logger and metrics.
	relayLogger, relayRegisterer := c.Logger, c.Registerer
	if c.Database != "" {
		if err := validate.Database(c.Database); err != nil {
			return c, fmt.Errorf("%w: Database: %w", ErrInvalidConfig, err)
		}
	}
	var relayNames relay.Config
	if c.Relay != nil {
		relayNames = *c.Relay
	}
	for _, part := range []struct {
		name, schema, channel, prefix, database string
	}{
		{"Outbox", c.Outbox.Schema, c.Outbox.NotifyChannel, "", ""},
		{"Relay", relayNames.Schema, relayNames.NotifyChannel, relayNames.Prefix, relayNames.Database},
	} {
		if part.schema != "" && part.schema != c.Schema || part.channel != "" && part.channel != c.NotifyChannel ||
			part.prefix != "" && part.prefix != c.Prefix || part.database != "" && part.database != c.Database {
			return c, fmt.Errorf("%w: %s names a schema, a notification channel, a key prefix or a database of its own: set Config.Schema, NotifyChannel, Prefix and Database alone",
				ErrInvalidConfig, part.name)
		}
	}
	c.Outbox.Schema, c.Outbox.NotifyChannel = c.Schema, c.NotifyChannel
	if c.Worker.Logger == nil {
		c.Worker.Logger = c.Logger
	}
	if c.Worker.Registerer == nil {
		c.Worker.Registerer = c.Registerer
	}
	if c.Database != "" {
		c.Logger = c.Logger.With("database", c.Database)
		c.Worker.Logger = c.Worker.Logger.With("database", c.Database)
		if c.Worker.Registerer != nil {
			c.Worker.Registerer = prometheus.WrapRegistererWith(prometheus.Labels{"database": c.Database}, c.Worker.Registerer)
		}
	}
	if c.Relay != nil {
		r := *c.Relay
		r.Schema, r.NotifyChannel, r.Prefix, r.Database = c.Schema, c.NotifyChannel, c.Prefix, c.Database
		if r.Logger == nil {
			r.Logger = relayLogger
		}
		if r.Registerer == nil {
			r.Registerer = relayRegisterer
		}
		c.Relay = &r
	}
	return c, nil
}

// Migrate creates or upgrades the outbox's tables in Config.Schema to this
// version of delayq (the migrations are embedded). Safe to call from every
// process at start: concurrent calls migrate once, the others wait.
func (c *Client) Migrate(ctx context.Context) error {
	var db *sql.DB
	if p, ok := c.pool.(*pgxpool.Pool); ok {
		db = migrations.OpenDBFromPool(p)
	} else { // a wrapper: a database/sql handle on the same server and database
		conn, err := c.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		connString := conn.Conn().Config().ConnString()
		conn.Release()
		if db, err = migrations.OpenDB(connString); err != nil {
			return err
		}
	}
	defer db.Close()
	_, err := migrations.Up(ctx, db, migrations.Config{Schema: c.cfg.Schema})
	return err
}

// Outbox returns the outbox client that enqueues for c: c is an
// outbox.Producer, so a typed queue enqueues through c directly.
func (c *Client) Outbox() *outbox.Client { return c.ob }

// Run runs the handlers registered on c, the schedules declared on it (see
// Schedule) and, with Config.Relay, the relay, until ctx ends; then it shuts down gracefully (in-flight handlers finish
// within WorkerConfig.ShutdownTimeout, the others are handed back) and returns
// nil. If one part stops with an error, Run stops the other and returns it. A
// schema that was not migrated stops Run at once with outbox.ErrNotMigrated;
// a client with no handler, no schedule and no relay returns ErrNoHandlers.
func (c *Client) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.running {
		c.mu.Unlock()
		return ErrRunning
	}
	c.running = true
	own := c.ownSchedules()
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.running = false
		c.mu.Unlock()
	}()

	var parts []func(context.Context) error
	if c.w.handlers() > 0 {
		parts = append(parts, c.w.Run)
	}
	if c.rl != nil {
		parts = append(parts, c.rl.Run)
	}
	if len(own.Schedules) > 0 {
		run, err := c.runSchedules(own)
		if err != nil { // checked by Schedule: not reached
			return err
		}
		parts = append(parts, run)
	}
	if len(parts) == 0 {
		return fmt.Errorf("%w: register a handler, declare a schedule, or set Config.Relay", ErrNoHandlers)
	}
	// Checked once here, so that a schema never migrated is one error, not
	// the worker's and the relay's each.
	if err := c.ob.CheckMigrated(ctx, c.pool); errors.Is(err, outbox.ErrNotMigrated) {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(parts))
	for _, run := range parts {
		go func() {
			err := run(ctx)
			cancel() // one part's end ends the others
			errs <- err
		}()
	}
	var all []error
	for range parts {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// Work claims one due task of queue and runs it to its end, synchronously, as
// Run would: middleware, handler, completion guard and commit, hooks, the Redis
// ack or retry. It is for tests (package delayqtest's Env.Work) and tools; it
// cannot be called while Run runs (ErrRunning). A queue without a registered
// handler is ErrInvalidQueue.
func (c *Client) Work(ctx context.Context, queue string) (WorkResult, error) {
	return c.w.Work(ctx, queue)
}

// Prioritize makes the queues of g, each registered before, share one pool of
// handler slots, claimed by weight (see PriorityGroup). Call it before Run.
func (c *Client) Prioritize(g PriorityGroup) error { return c.w.Prioritize(g) }

// Handle registers a plain handler for queue's raw payloads (Task.Payload),
// for payloads that are not values of one Go type; see Register for typed
// ones. Register before Run.
func (c *Client) Handle(queue string, h func(ctx context.Context, t *Task) error, cfg QueueConfig) error {
	return c.w.Handle(queue, h, cfg)
}

// HandleTx registers a transactional handler for queue's raw payloads; see
// RegisterTx. Register before Run.
func (c *Client) HandleTx(queue string, h func(ctx context.Context, tx pgx.Tx, t *Task) error, cfg QueueConfig) error {
	return c.w.HandleTx(queue, h, cfg)
}

// HandleSQLTx registers a database/sql transactional handler, on db, for
// queue's raw payloads; see RegisterSQL. Register before Run.
func (c *Client) HandleSQLTx(queue string, db *sql.DB, h func(ctx context.Context, tx *sql.Tx, t *Task) error, cfg QueueConfig) error {
	return c.w.HandleSQLTx(queue, db, h, cfg)
}

// Workers lists the worker processes of this deployment (its key prefix) from
// their heartbeats in Redis: each process running handlers (Run) registers
// itself with its host, pid, delayq version, queues and their concurrency, and
// the runs it has in flight, beats every Lease/3, and leaves when Run returns. A
// process gone without leaving is listed Lost a lease after its last beat, for
// ten minutes. See delayqtype.Worker; `delayq workers` and the dashboard show the
// same list.
func (c *Client) Workers(ctx context.Context) ([]delayqtype.Worker, error) { return c.dq.Workers(ctx) }

// RunStats counts the runs of this client's handlers since it was created.
func (c *Client) RunStats() RunStats { return c.w.Stats() }

// Config returns the effective configuration (defaults applied).
func (c *Client) Config() Config {
	cfg := c.cfg
	cfg.Worker = c.w.Config()
	return cfg
}

// DB returns the PostgreSQL pool c was built on.
func (c *Client) DB() outbox.DB { return c.pool }

// Redis returns the Redis client c was built on.
func (c *Client) Redis() redis.UniversalClient { return c.rdb }
