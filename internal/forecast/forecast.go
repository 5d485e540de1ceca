// Package forecast is the autoscaling signal of the relay sidecar. The outbox
// knows the future: every pending and queued row has its due time. A Forecaster
// reads, every Config.Interval, how many tasks of each queue fall due in each
// minute of the next hour (PostgreSQL, one bounded statement: DueCounts), and the
// ready backlog, the runs in progress, the oldest lateness and the pause of each
// queue (Redis, the reads the dashboard and delayq stats make: StatsMany,
// PausedMany). It keeps the result, and serves it from memory:
//
//   - as Prometheus metrics (Collector): delayq_forecast_due_tasks{queue,horizon},
//     delayq_forecast_desired_workers{queue}, and the refresh's own age, duration
//     and errors;
//   - as JSON for KEDA's metrics-api scaler (Handler, GET /forecast), with the
//     number of workers a queue needs ahead of a known peak.
//
// The recommendation (Params.Workers) is the most workers any of the next lead
// minutes needs: the tasks due in the minute (and, in the first, the backlog)
// times the mean handling time, over a minute of one worker's concurrency. A
// scrape or a request never queries a store.
package forecast

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
)

// Minutes is the forecast's length: the next hour, minute by minute.
const Minutes = 60

// Defaults of Config and Params.
const (
	DefaultInterval     = 30 * time.Second
	DefaultTimeout      = 5 * time.Second
	DefaultLead         = 5 * time.Minute
	DefaultHandling     = time.Second
	DefaultConcurrency  = 10
	MaxHandling         = time.Hour
	MaxConcurrency      = 100_000
	staleAfterIntervals = 3
)

// ErrInvalidConfig reports a Config that does not validate; ErrInvalidParams
// reports Params that do not (a request's query: 400).
var (
	ErrInvalidConfig = errors.New("forecast: invalid config")
	ErrInvalidParams = errors.New("forecast: invalid parameters")
)

// Params are the inputs of the recommended worker count. The zero value of a
// field means its default.
type Params struct {
	// Lead is how far ahead the workers are sized: the recommendation is the
	// most any of the next Lead's minutes needs (rounded up to whole minutes), so
	// workers are there Lead before a peak and stay until it has passed. 1m..60m;
	// default 5m: KEDA's polling, the HPA and a pod's start fit in it.
	Lead time.Duration
	// Handling is the mean time a worker slot spends on a task (the mean of
	// delayq_worker_processing_seconds). 1ms..1h; default 1s.
	Handling time.Duration
	// Concurrency is the tasks one worker runs at once (delayq worker
	// --concurrency, WorkerConfig's per queue). 1..100000; default 10 (delayq
	// worker's).
	Concurrency int
}

// WithDefaults returns p with its zero fields set to their defaults.
func (p Params) WithDefaults() Params {
	if p.Lead == 0 {
		p.Lead = DefaultLead
	}
	if p.Handling == 0 {
		p.Handling = DefaultHandling
	}
	if p.Concurrency == 0 {
		p.Concurrency = DefaultConcurrency
	}
	return p
}

// Validate checks p, defaults applied first; its errors wrap ErrInvalidParams
// and name the field.
func (p Params) Validate() error {
	p = p.WithDefaults()
	switch {
	case p.Lead < time.Minute || p.Lead > Minutes*time.Minute:
		return fmt.Errorf("%w: lead %v: want 1m..60m", ErrInvalidParams, p.Lead)
	case p.Handling < time.Millisecond || p.Handling > MaxHandling:
		return fmt.Errorf("%w: handling %v: want 1ms..1h", ErrInvalidParams, p.Handling)
	case p.Concurrency < 1 || p.Concurrency > MaxConcurrency:
		return fmt.Errorf("%w: concurrency %d: want 1..%d", ErrInvalidParams, p.Concurrency, MaxConcurrency)
	}
	return nil
}

// leadMinutes is Lead in whole minutes, rounded up, within 1..Minutes.
func (p Params) leadMinutes() int {
	n := int((p.Lead + time.Minute - 1) / time.Minute)
	return min(max(n, 1), Minutes)
}

// Queue is one queue's forecast.
type Queue struct {
	Name string
	// Due[i] counts the pending and queued tasks due in minute i after the
	// snapshot's At: in [At + i min, At + (i+1) min). Tasks due later than the
	// hour are not counted.
	Due [Minutes]int64
	// OverduePending counts the pending rows already due, not yet in Redis (the
	// relay's lag; usually 0).
	OverduePending int64
	// Ready is Redis's backlog: tasks due and not claimed. Active counts the runs
	// in progress.
	Ready, Active int64
	// OldestLateness is how long the earliest ready task has been due (0 when
	// none is).
	OldestLateness time.Duration
	// Paused: the queue is paused (Redis's copy of the controls, the one the
	// workers' claims obey). A paused queue needs no worker.
	Paused bool
}

// DueWithin counts the tasks due within the next d (whole minutes, at most the
// hour), those already due not included.
func (q *Queue) DueWithin(d time.Duration) int64 {
	var n int64
	for _, c := range q.Due[:min(max(int(d/time.Minute), 0), Minutes)] {
		n += c
	}
	return n
}

// Workers is the number of workers q needs over the next p.Lead: the most
// any of those minutes needs, where minute i needs
//
//	⌈ due_i × Handling ÷ (1 min × Concurrency) ⌉
//
// due_0 being the tasks due in the first minute plus the backlog (ready and
// overdue pending), which the workers should clear within that minute. A paused
// queue needs none: its workers could claim nothing. p must have been validated
// (Validate), with defaults applied.
func (p Params) Workers(q *Queue) int64 {
	if q.Paused {
		return 0
	}
	var peak int64
	for i := range p.leadMinutes() {
		d := q.Due[i]
		if i == 0 {
			d += q.Ready + q.OverduePending
		}
		peak = max(peak, d)
	}
	return ceilDiv(uint64(max(peak, 0)), uint64(p.Handling/time.Microsecond), uint64(time.Minute/time.Microsecond)*uint64(p.Concurrency))
}

// ceilDiv is ⌈a·b / d⌉ without overflow, capped at MaxInt64.
func ceilDiv(a, b, d uint64) int64 {
	hi, lo := bits.Mul64(a, b)
	if hi >= d {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, d)
	if r > 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// Snapshot is one refresh's forecast.
type Snapshot struct {
	// At is the start of the forecast's first minute (the refresh's clock).
	At time.Time
	// Queues, by name.
	Queues []Queue
}

// Queue returns the forecast of the named queue, and false when the snapshot
// holds none (nothing due within the hour, no backlog).
func (s *Snapshot) Queue(name string) (Queue, bool) {
	i, ok := slices.BinarySearchFunc(s.Queues, name, func(q Queue, n string) int {
		switch {
		case q.Name < n:
			return -1
		case q.Name > n:
			return 1
		}
		return 0
	})
	if !ok {
		return Queue{Name: name}, false
	}
	return s.Queues[i], true
}

// Build assembles a snapshot from the stores' answers: counts (DueCounts from
// at), stats (StatsMany) and paused (PausedMany). Every queue named in any of
// them has an entry. Counts outside the hour are left out.
func Build(at time.Time, counts []taskstate.DueCount, stats []dispatch.QueueStats, paused map[string]bool) Snapshot {
	byName := map[string]*Queue{}
	get := func(name string) *Queue {
		q, ok := byName[name]
		if !ok {
			q = &Queue{Name: name}
			byName[name] = q
		}
		return q
	}
	for _, c := range counts {
		switch q := get(c.Queue); {
		case c.Minute < 0:
			q.OverduePending += c.Rows
		case c.Minute < Minutes:
			q.Due[c.Minute] += c.Rows
		}
	}
	for _, st := range stats {
		q := get(st.Queue)
		q.Ready, q.Active, q.OldestLateness = st.DueNow, st.Active, st.OldestLateness
	}
	for name, p := range paused {
		get(name).Paused = p
	}
	s := Snapshot{At: at, Queues: make([]Queue, 0, len(byName))}
	for _, q := range byName {
		s.Queues = append(s.Queues, *q)
	}
	slices.SortFunc(s.Queues, func(a, b Queue) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return s
}

// Config configures a Forecaster. The zero value means every default.
type Config struct {
	// Schema holds the outbox table. Default "public".
	Schema string
	// Queues limits the forecast to these queues (the relay's --queues). Default:
	// every queue with rows due within the hour or registered in Redis.
	Queues []string
	// Interval is the time between two refreshes. Default 30s. A scrape or a
	// request reads the last refresh; the answer is refused as stale (503) once
	// it is three intervals old.
	Interval time.Duration
	// Timeout bounds one refresh's statement: the server cancels it then
	// (statement_timeout), so a refresh never loads the database longer whatever
	// the table holds; the whole refresh, the Redis reads with it, gets a second
	// more. Default 5s.
	Timeout time.Duration
	// Params are the recommendation's defaults: those of the
	// delayq_forecast_desired_workers gauge, and of a request that does not set
	// its own.
	Params Params
	// Registerer, when set, gets the Collector. Default none.
	Registerer prometheus.Registerer
	// Logger. Default: discard.
	Logger *slog.Logger
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Schema == "" {
		c.Schema = taskstate.DefaultSchema
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	c.Params = c.Params.WithDefaults()
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Validate checks c, defaults applied first; its errors wrap ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if c.Interval < time.Second {
		return fmt.Errorf("%w: Interval %v: at least 1s", ErrInvalidConfig, c.Interval)
	}
	if c.Timeout < time.Millisecond {
		return fmt.Errorf("%w: Timeout %v: at least 1ms", ErrInvalidConfig, c.Timeout)
	}
	if !plainSchema(c.Schema) {
		return fmt.Errorf("%w: Schema %q: 1..63 bytes of a-z, 0-9 (not first) and '_'", ErrInvalidConfig, c.Schema)
	}
	for _, q := range c.Queues {
		if err := validate.Queue(q); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if err := c.Params.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// plainSchema reports whether s is a schema name that means the same quoted or
// not (migrations' rule), safe to splice into SQL.
func plainSchema(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c == '_' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// DB is what a Forecaster reads PostgreSQL through (*pgxpool.Pool).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Forecaster refreshes the forecast every Interval (Run) and serves the last
// one (Last, Handler, its metrics).
type Forecaster struct {
	cfg   Config
	db    DB
	dq    *dispatch.Client
	store *taskstate.Store
	m     *collector

	last    atomic.Pointer[Snapshot]
	failing atomic.Bool // the last refresh failed (logged once)
	mu      sync.Mutex  // one refresh at a time
}

// New returns a Forecaster on db and dq; it reads nothing until Run or Refresh.
func New(db DB, dq *dispatch.Client, cfg Config) (*Forecaster, error) {
	if db == nil || dq == nil {
		return nil, fmt.Errorf("%w: a database and a Redis client are required", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	f := &Forecaster{cfg: cfg, db: db, dq: dq, store: taskstate.New(taskstate.Config{Schema: cfg.Schema})}
	f.m = newCollector(f)
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(f.m); err != nil {
			return nil, fmt.Errorf("forecast: register metrics: %w", err)
		}
	}
	return f, nil
}

// Config returns the configuration in effect, defaults applied.
func (f *Forecaster) Config() Config { return f.cfg }

// Last returns the last refresh's snapshot, and false before the first.
func (f *Forecaster) Last() (Snapshot, bool) {
	s := f.last.Load()
	if s == nil {
		return Snapshot{}, false
	}
	return *s, true
}

// Run refreshes at once and then every Interval until ctx ends; a failed refresh
// is logged (once until one succeeds), counted, and tried again at the next tick,
// the last snapshot kept meanwhile. It returns nil when ctx ends.
func (f *Forecaster) Run(ctx context.Context) error {
	t := time.NewTicker(f.cfg.Interval)
	defer t.Stop()
	for {
		if err := f.Refresh(ctx); err != nil && ctx.Err() == nil {
			if !f.failing.Swap(true) {
				f.cfg.Logger.Warn("forecast: refresh failed; serving the last forecast", "error", err.Error())
			}
		} else if err == nil && f.failing.Swap(false) {
			f.cfg.Logger.Info("forecast: refreshed again")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Refresh reads both stores once and replaces the snapshot, at the time of the
// call.
func (f *Forecaster) Refresh(ctx context.Context) error {
	return f.RefreshAt(ctx, time.Now())
}

// RefreshAt is Refresh with the forecast starting at at (tests and benchmarks
// place due times around it).
func (f *Forecaster) RefreshAt(ctx context.Context, at time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	start := time.Now()
	s, err := f.read(ctx, at.Truncate(time.Microsecond)) // the outbox's precision
	f.m.refreshed(time.Since(start), err)
	if err != nil {
		return err
	}
	f.last.Store(&s)
	return nil
}

func (f *Forecaster) read(ctx context.Context, at time.Time) (Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout+time.Second)
	defer cancel()
	counts, err := f.dueCounts(ctx, at)
	if err != nil {
		return Snapshot{}, err
	}
	queues := f.cfg.Queues
	if queues == nil {
		if queues, err = f.dq.RegisteredQueues(ctx); err != nil {
			return Snapshot{}, fmt.Errorf("forecast: %w", err)
		}
		for _, c := range counts {
			queues = append(queues, c.Queue)
		}
		slices.Sort(queues)
		queues = slices.Compact(queues)
	}
	stats, err := f.dq.StatsMany(ctx, 0, queues...)
	if err != nil {
		return Snapshot{}, fmt.Errorf("forecast: %w", err)
	}
	paused, err := f.dq.PausedMany(ctx, queues...)
	if err != nil {
		return Snapshot{}, fmt.Errorf("forecast: %w", err)
	}
	return Build(at, counts, stats, paused), nil
}

// dueCounts runs DueCounts in a read-only transaction whose statement the
// server cancels after Timeout, so that a refresh never loads the database
// longer, whatever the table holds.
func (f *Forecaster) dueCounts(ctx context.Context, at time.Time) ([]taskstate.DueCount, error) {
	tx, err := f.db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("forecast: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", max(f.cfg.Timeout.Milliseconds(), 1))); err != nil {
		return nil, fmt.Errorf("forecast: %w", err)
	}
	if _, err := tx.Exec(ctx, "SET TRANSACTION READ ONLY"); err != nil {
		return nil, fmt.Errorf("forecast: %w", err)
	}
	counts, err := f.store.DueCounts(ctx, tx, at, Minutes, f.cfg.Queues)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "57014" { // query_canceled: the statement timeout
		return nil, fmt.Errorf("forecast: counting the due rows took longer than %v (the statement was cancelled): %w", f.cfg.Timeout, err)
	}
	if err != nil {
		return nil, fmt.Errorf("forecast: %w", err)
	}
	return counts, nil
}

// stale reports whether s is too old to serve: three intervals.
func (f *Forecaster) stale(s *Snapshot, now time.Time) bool {
	return now.Sub(s.At) > staleAfterIntervals*f.cfg.Interval
}
