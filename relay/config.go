package relay

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/schedule"
)

// Defaults of Config (its fields' comments state them; Config{}.WithDefaults()
// has them all).
const (
	defaultHorizon           = time.Hour
	defaultBatchSize         = 1000
	defaultPollInterval      = 5 * time.Second
	defaultReapInterval      = time.Second
	defaultReapBatch         = 1000
	defaultRetention         = 7 * 24 * time.Hour
	defaultRetentionBatch    = 1000
	defaultRetentionInterval = time.Minute
	defaultStatsInterval     = 15 * time.Second
	defaultQueueRefresh      = 30 * time.Second
	defaultBackoffMin        = 100 * time.Millisecond
	defaultBackoffMax        = 5 * time.Second
	defaultRoundTimeout      = 30 * time.Second
	defaultRepairRate        = 5000
	defaultRepairBatch       = 500
	defaultRepairPause       = 30 * time.Second
	defaultLossCheckInterval = time.Second
	defaultLeaderRetry       = 5 * time.Second
	defaultOverdueAfter      = time.Minute
	defaultFollowUp          = 5 * time.Millisecond
	defaultFollowUpFor       = 100 * time.Millisecond
)

// Config configures a Relay. The zero value means every default. Durations that
// can be turned off take -1 for "off".
type Config struct {
	// Schema holds the outbox table (as given to package migrations). Default
	// "public".
	Schema string
	// NotifyChannel is the channel the producers notify at commit (outbox
	// Config.NotifyChannel). Default "delayq_outbox".
	NotifyChannel string
	// Prefix starts every Redis key; the workers' must be the same. Default
	// "dq". (In delayq.Config.Relay, leave Schema, NotifyChannel and Prefix
	// empty: the client names them.)
	Prefix string
	// Database names this relay's outbox database when several feed one Redis
	// (docs/DESIGN.md, "Several databases"): its tasks live under Prefix + ":" +
	// Database, its metrics carry the label database=<key> and its log lines the
	// attribute database. Each database has its relay (or relays), which heals
	// that database's tasks alone. Default "": one database, keys under Prefix.
	// 1..32 bytes of [a-z0-9_-].
	Database string

	// Queues limits the relay, and its reaper, to these queues. Default: every
	// queue. The reaper then discovers the queues from Postgres (those with queued
	// rows, refreshed every QueueRefresh) and from the rows it relays.
	Queues []string
	// QueueRefresh is how often the discovered queue list is read again. Default
	// 30s.
	QueueRefresh time.Duration

	// Horizon: rows due within it are moved to Redis; later ones wait in Postgres,
	// so Redis memory follows the near-term load. Default 1h.
	Horizon time.Duration
	// BatchSize is the most rows one round moves (1..10,000). A full round is
	// followed by the next at once, so a backlog drains at full speed. Default 1000.
	BatchSize int
	// PollInterval is the longest wait between rounds, the backstop against lost
	// notifications. Between rounds the relay waits for a notification at commit,
	// or until the next pending row comes within the horizon. Default 5s.
	PollInterval time.Duration
	// PollOnly makes the relay poll instead of LISTENing for the producers'
	// notifications, for a connection pooler in transaction mode (PgBouncer's
	// pool_mode=transaction), where LISTEN is not available: a round runs when the
	// next pending row comes within the horizon (read from Postgres after every
	// round) and every PollInterval, so a task due sooner than PollInterval after
	// its commit reaches Redis up to PollInterval late (half of it on average). The
	// self-healing leader then holds its advisory lock in an open transaction (which
	// the pooler keeps on one server connection) rather than a session. Default
	// false.
	PollOnly bool
	// FollowUp and FollowUpFor: for FollowUpFor after every notification (each
	// notification starting the time again) the relay runs follow-up rounds, which
	// move the tasks whose enqueues left their notification out because one into
	// the same queue had just notified and committed (outbox
	// Config.NotifyCooldown, 25ms by default: keep FollowUpFor at least 25ms
	// above it, plus a round, since a later commit notifies by itself): the
	// next at once after a round that moved rows, FollowUp after one that found
	// none. Defaults 5ms and 100ms; FollowUpFor -1 turns the follow-up off (then
	// set the producers' NotifyCooldown to -1 too).
	FollowUp, FollowUpFor time.Duration
	// RoundTimeout bounds one round (select, Redis write, update, commit). A round
	// in hand is finished, not abandoned, when Run's context ends. Default 30s.
	RoundTimeout time.Duration

	// ReapInterval is how often expired leases are taken back (tasks of crashed or
	// stuck workers). Default 1s; -1 turns the reaper off (another process reaps).
	ReapInterval time.Duration
	// ReapBatch is the most leases one Reap call takes back per queue (1..10,000);
	// a full one is followed by the next at once. Default 1000.
	ReapBatch int

	// Retention is how long done and cancelled rows are kept after they finished:
	// the idempotency window of the outbox. Dead rows are never deleted here; they
	// wait for a person. Default 7 days; -1 keeps every row.
	Retention time.Duration
	// RetentionBatch is the most rows one delete removes (each its own short
	// transaction). Default 1000.
	RetentionBatch int
	// RetentionInterval is how often finished rows are pruned. Default 1m.
	RetentionInterval time.Duration

	// StatsInterval is how often the outbox depth and the relay lag gauges are
	// refreshed (the lag also after every round that is neither full nor a
	// follow-up round). Default 15s;
	// -1 turns the refresh off.
	StatsInterval time.Duration

	// BackoffMin and BackoffMax bound the jittered exponential backoff after an
	// error (Postgres or Redis down). Defaults 100ms and 5s.
	BackoffMin, BackoffMax time.Duration

	// Logger receives state changes (a server down, up again) and errors; nothing
	// per row or per round. Default: discard.
	Logger *slog.Logger
	// Registerer, when set, gets the relay's Prometheus collectors: the Prometheus
	// Observer. Relays and workers sharing one share the collectors (counters add
	// up; a gauge shows what the relay that set it last saw). Default nil: no
	// Prometheus metrics (Stats still counts).
	Registerer prometheus.Registerer
	// Observer, when set, receives the relay's events (tracing, custom metrics);
	// combine several with Observers. Default nil.
	Observer Observer

	// Schedules are the periodic tasks this relay enqueues into the outbox, each
	// tick once whatever the number of relays and workers running them (package
	// schedule; delayq relay --schedules FILE). Schedules declared in Go beside
	// their handlers are run by the worker instead (delayq.Client.Schedule).
	// Default: none.
	Schedules schedule.Config

	// afterEnqueue, when set (by tests), runs after the Redis write and before the
	// commit of a round; an error it returns aborts the round.
	afterEnqueue func() error

	// RepairRate is how many queued rows a second the anti-entropy pass compares
	// with Redis (one probe per RepairBatch rows: 10 Redis calls a second by
	// default, more only for what it repairs): a pass over 1,000,000 queued rows
	// takes under 4 minutes. After a detected Redis loss the pass runs at full
	// speed. Default 5000; -1 turns self-healing off (loss detection too).
	RepairRate int
	// RepairBatch is how many rows one step of the pass reads and probes
	// (1..1000). Default 500.
	RepairBatch int
	// RepairPause is the wait between two complete passes. Default 30s.
	RepairPause time.Duration
	// LossCheckInterval is how often the leader reads the epoch marks of the
	// Redis masters, the bound on how late a Redis loss is detected. Default 1s.
	LossCheckInterval time.Duration
	// LeaderRetry: a relay that does not lead the self-healing tries to every
	// LeaderRetry (jittered), so one takes over that long after the leader ends.
	// Default 5s.
	LeaderRetry time.Duration
	// OverdueAfter: a task in Redis due more than this long ago and not claimed is
	// overdue (delayq_relay_overdue_tasks). Default 1m.
	OverdueAfter time.Duration
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	defInt := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	if c.Schema == "" {
		c.Schema = taskstate.DefaultSchema
	}
	if c.NotifyChannel == "" {
		c.NotifyChannel = taskstate.DefaultNotifyChannel
	}
	def(&c.QueueRefresh, defaultQueueRefresh)
	def(&c.Horizon, defaultHorizon)
	defInt(&c.BatchSize, defaultBatchSize)
	def(&c.PollInterval, defaultPollInterval)
	def(&c.RoundTimeout, defaultRoundTimeout)
	def(&c.FollowUp, defaultFollowUp)
	def(&c.FollowUpFor, defaultFollowUpFor)
	def(&c.ReapInterval, defaultReapInterval)
	defInt(&c.ReapBatch, defaultReapBatch)
	def(&c.Retention, defaultRetention)
	defInt(&c.RetentionBatch, defaultRetentionBatch)
	def(&c.RetentionInterval, defaultRetentionInterval)
	def(&c.StatsInterval, defaultStatsInterval)
	def(&c.BackoffMin, defaultBackoffMin)
	def(&c.BackoffMax, defaultBackoffMax)
	defInt(&c.RepairRate, defaultRepairRate)
	defInt(&c.RepairBatch, defaultRepairBatch)
	def(&c.RepairPause, defaultRepairPause)
	def(&c.LossCheckInterval, defaultLossCheckInterval)
	def(&c.LeaderRetry, defaultLeaderRetry)
	def(&c.OverdueAfter, defaultOverdueAfter)
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Validate reports whether c, with its defaults, is a valid configuration (New
// does the same), so a command can reject bad flags before it connects.
func (c Config) Validate() error { return c.WithDefaults().validate() }

func (c Config) validate() error {
	if err := c.validateFeatures(); err != nil {
		return err
	}
	if _, err := outbox.New(outbox.Config{Schema: c.Schema, NotifyChannel: c.NotifyChannel}); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.Database != "" {
		if err := validate.Database(c.Database); err != nil {
			return fmt.Errorf("%w: Database: %w", ErrInvalidConfig, err)
		}
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	positive := func(name string, d time.Duration, canBeOff bool) error {
		if d > 0 || canBeOff && d == -1 {
			return nil
		}
		if canBeOff {
			return bad("%s %v: must be positive, or -1 for off", name, d)
		}
		return bad("%s %v: must be positive", name, d)
	}
	for _, q := range c.Queues {
		if err := validate.Queue(q); err != nil {
			return fmt.Errorf("%w: Queues: %w", ErrInvalidConfig, err)
		}
	}
	for _, p := range []struct {
		name     string
		d        time.Duration
		canBeOff bool
	}{
		{"QueueRefresh", c.QueueRefresh, false},
		{"Horizon", c.Horizon, false},
		{"PollInterval", c.PollInterval, false},
		{"RoundTimeout", c.RoundTimeout, false},
		{"FollowUp", c.FollowUp, false},
		{"FollowUpFor", c.FollowUpFor, true},
		{"ReapInterval", c.ReapInterval, true},
		{"Retention", c.Retention, true},
		{"RetentionInterval", c.RetentionInterval, false},
		{"StatsInterval", c.StatsInterval, true},
		{"BackoffMin", c.BackoffMin, false},
		{"BackoffMax", c.BackoffMax, false},
		{"RepairPause", c.RepairPause, false},
		{"LossCheckInterval", c.LossCheckInterval, false},
		{"LeaderRetry", c.LeaderRetry, false},
		{"OverdueAfter", c.OverdueAfter, false},
	} {
		if err := positive(p.name, p.d, p.canBeOff); err != nil {
			return err
		}
	}
	switch {
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return bad("BatchSize %d: 1..10000", c.BatchSize)
	case c.ReapBatch < 1 || c.ReapBatch > 10000:
		return bad("ReapBatch %d: 1..10000", c.ReapBatch)
	case c.RetentionBatch < 1 || c.RetentionBatch > 100000:
		return bad("RetentionBatch %d: 1..100000", c.RetentionBatch)
	case c.RepairRate < 1 && c.RepairRate != -1:
		return bad("RepairRate %d: rows a second, at least 1, or -1 for off", c.RepairRate)
	case c.RepairBatch < 1 || c.RepairBatch > 1000:
		return bad("RepairBatch %d: 1..1000", c.RepairBatch)
	case c.FollowUpFor != -1 && c.FollowUp > c.FollowUpFor:
		return bad("FollowUp %v above FollowUpFor %v", c.FollowUp, c.FollowUpFor)
	case c.BackoffMax < c.BackoffMin:
		return bad("BackoffMax %v below BackoffMin %v", c.BackoffMax, c.BackoffMin)
	}
	return nil
}
