package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/downlog"
	"github.com/delayq/delayq/internal/notmigrated"
	"github.com/delayq/delayq/internal/relayobs"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/transition"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// Relay moves due-soon outbox rows into Redis, reaps expired leases and prunes
// finished rows. Create it with New and start it with Run.
type Relay struct {
	pool  outbox.DB
	dq    *dispatch.Client
	cfg   Config
	sql   taskstate.Statements // reads
	ops   *transition.Ops      // every write of a task's state
	table string
	obs   relayobs.Observer // the Prometheus observer, Config.Observer and stats
	stats statsObserver

	pg, rd *downlog.Tracker // state of the two servers, for logs once per change

	started atomic.Bool
	wake    chan struct{} // a notification arrived (buffer 1: a flag)

	queuesMu   sync.Mutex
	queued     []string // queues with queued rows, as last read from Postgres
	registered []string // the Redis queue registry as last read, with the queues relayed since
	refreshed  time.Time

	heal healState

	mirrored atomic.Int64 // Unix ns of the last controls mirror a round asked for
	noShards atomic.Bool  // the role may not read delayq_queues: no ShardedQueues
}

// New returns a Relay on pool (the outbox database, a *pgxpool.Pool or a wrapper of
// one: the relay holds some of its connections, its rounds while they follow one
// another, LISTEN, the healing leader's advisory lock) and rdb (Redis, with keys
// under cfg.Prefix). cfg is completed with WithDefaults and validated; the
// metrics are registered on cfg.Registerer. A service's own process runs the
// relay through delayq.Config.Relay instead; New is for a relay of its own (the
// delayq relay command).
func New(pool outbox.DB, rdb redis.UniversalClient, cfg Config) (*Relay, error) {
	if pool == nil || rdb == nil {
		return nil, fmt.Errorf("%w: nil pool or Redis client", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Database != "" {
		cfg.Logger = cfg.Logger.With("database", cfg.Database)
		if cfg.Registerer != nil {
			cfg.Registerer = prometheus.WrapRegistererWith(prometheus.Labels{"database": cfg.Database}, cfg.Registerer)
		}
	}
	dq, err := dispatch.On(rdb, dispatch.Config{Prefix: dispatch.Namespace(cfg.Prefix, cfg.Database), Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	store := taskstate.New(taskstate.Config{Schema: cfg.Schema, NotifyChannel: cfg.NotifyChannel})
	r := &Relay{
		pool:  pool,
		dq:    dq,
		cfg:   cfg,
		table: store.Table(),
		sql:   store.SQL,
		ops:   transition.New(store, dq),
		wake:  make(chan struct{}, 1),
	}
	var prom relayobs.Observer
	if cfg.Registerer != nil {
		m, err := newMetrics(cfg.Registerer)
		if err != nil {
			return nil, err
		}
		prom = m
	}
	r.obs = relayobs.Observers(prom, observerOf(cfg.Observer), &r.stats)
	r.pg = downlog.New(cfg.Logger, "relay", "PostgreSQL")
	r.rd = downlog.New(cfg.Logger, "relay", "Redis")
	return r, nil
}

// Config returns the effective configuration (defaults applied).
func (r *Relay) Config() Config { return r.cfg }

// checkOutbox reports outbox.ErrNotMigrated when the outbox table does not
// exist, so Run can stop with a clear message instead of retrying.
func (r *Relay) checkOutbox(ctx context.Context) error {
	var found bool
	if err := r.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, r.table).Scan(&found); err != nil {
		return fmt.Errorf("relay: look for the outbox table: %w", err)
	}
	if !found {
		return fmt.Errorf("relay: %w", notmigrated.Table(r.table))
	}
	return nil
}

// Run relays, reaps and prunes until ctx ends, then returns nil after finishing
// the round in hand (committed or rolled back, never left half done). Errors of
// the servers do not end it: it backs off with jitter, logs once when a server
// goes down and once when it is back, and resumes by itself. It returns an error
// only when called twice (ErrRunning), or at once when the outbox table does not
// exist (outbox.ErrNotMigrated).
func (r *Relay) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return ErrRunning
	}
	// A schema never migrated fails every round: say so once and stop. (A server
	// that cannot be reached yet is the loops' to wait for.)
	if err := r.checkOutbox(ctx); errors.Is(err, outbox.ErrNotMigrated) {
		return err
	}
	var wg sync.WaitGroup
	loops := []func(context.Context){r.relayLoop}
	if !r.cfg.PollOnly {
		loops = append(loops, r.listenLoop)
	}
	if r.cfg.ReapInterval > 0 {
		loops = append(loops, r.reapLoop)
	}
	if r.cfg.Retention > 0 {
		loops = append(loops, r.retentionLoop)
	}
	if r.cfg.StatsInterval > 0 {
		loops = append(loops, r.statsLoop)
	}
	if r.cfg.RepairRate != -1 {
		loops = append(loops, r.healLoop)
	}
	loops = append(loops, r.featureLoops()...) // schedule.go
	for _, loop := range loops {
		wg.Go(func() { loop(ctx) })
	}
	wg.Wait()
	return nil
}

// relayLoop runs rounds: at once after a full one, else after a notification, when
// the next pending row comes within the horizon, or after the poll interval; and
// for FollowUpFor after a notification, for the tasks whose enqueue left its
// notification out (outbox Config.NotifyCooldown), at once after a round that
// moved rows and FollowUp after one that found none.
//
// The loop keeps its connection while rounds follow one another and gives it back
// to the pool before a longer wait: a round under load neither waits for a
// connection the relay's other loops hold (the pool is 4 by default) nor for one
// the pool has to open.
func (r *Relay) relayLoop(ctx context.Context) {
	bo := newBackoff(r.cfg.BackoffMin, r.cfg.BackoffMax)
	var followUntil time.Time // the follow-up of the last notification ends then
	woken := func() {
		if r.cfg.FollowUpFor > 0 {
			followUntil = time.Now().Add(r.cfg.FollowUpFor)
		}
	}
	var conn *pgxpool.Conn // held between rounds that follow one another
	release := func() {
		if conn != nil {
			conn.Release() // the pool closes it if the round left it broken
			conn = nil
		}
	}
	defer release()
	for ctx.Err() == nil {
		n, err := r.round(ctx, &conn)
		if err != nil {
			release()
			if !sleep(ctx, bo.next()) {
				return
			}
			continue
		}
		bo.reset()
		if n == r.cfg.BatchSize {
			continue
		}
		following := time.Until(followUntil) > 0
		if following && n > 0 {
			// Producers are active: the next round at once finds the rows
			// committed during this one soonest. Each such round moves a row or
			// more, so this costs at most a round a row; an empty one waits.
			select {
			case <-r.wake:
				woken()
			default:
			}
			continue
		}
		wait := r.cfg.FollowUp
		if !following {
			release()
			wait = r.cfg.PollInterval
			if d, err := r.untilNext(ctx); err == nil && d < wait {
				wait = d
			}
		}
		if wait <= 0 {
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-r.wake:
			woken()
		case <-t.C:
		}
		t.Stop()
	}
}

// round moves one batch: lock due rows and mark them queued (one statement),
// enqueue them in Redis in one pipelined round trip, commit. It returns the number of rows
// selected. On an error nothing is committed: the rows stay pending and the next
// round moves them again, which Redis reports as duplicates. It runs on *conn,
// acquiring one from the pool into it when it is nil; the caller releases it.
func (r *Relay) round(ctx context.Context, conn **pgxpool.Conn) (int, error) {
	// The round in hand is finished even when ctx ends.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.RoundTimeout)
	defer cancel()
	start := time.Now()

	if *conn == nil {
		c, err := r.pool.Acquire(ctx)
		if err != nil {
			return 0, r.pgErr(errPostgres, "acquire a connection", err)
		}
		*conn = c
	}
	tx, err := (*conn).Begin(ctx)
	if err != nil {
		return 0, r.pgErr(errPostgres, "begin", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op

	rows, err := r.take(ctx, tx)
	if err != nil {
		return 0, r.pgErr(errPostgres, "take due rows", err)
	}
	r.pg.OK()
	if len(rows) == 0 {
		return 0, nil
	}
	// RETURNING comes in no particular order: back to run_at order.
	slices.SortStableFunc(rows, func(a, b taskstate.Taken) int { return a.RunAt.Compare(b.RunAt) })

	// Group by queue, keeping run_at order; set aside rows Redis would refuse.
	var (
		batches      []dispatch.QueueTasks
		byQueue      = map[string]int{}
		bad          []pgtype.TID
		badID, badEr []string
	)
	for _, x := range rows {
		t := x.Task()
		// A row no Redis key can hold (written by hand or by an older version) is
		// set dead with the reason, and the round goes on without it.
		if err := errors.Join(validate.Queue(x.Queue), r.dq.ValidateTask(t)); err != nil {
			bad, badID = append(bad, x.CTID), append(badID, x.Queue+"/"+x.ID)
			badEr = append(badEr, validate.ErrorSummary("relay: Redis cannot hold the task: "+err.Error()))
			continue
		}
		i, ok := byQueue[x.Queue]
		if !ok {
			i = len(batches)
			byQueue[x.Queue] = i
			batches = append(batches, dispatch.QueueTasks{Queue: x.Queue, Shards: x.Shards})
		}
		batches[i].Tasks = append(batches[i].Tasks, t)
	}

	statuses, err := r.enqueue(ctx, tx, batches)
	if err != nil {
		return 0, r.redisErr(errRedis, "enqueue", err)
	}
	r.rd.OK()
	if r.cfg.afterEnqueue != nil {
		if err := r.cfg.afterEnqueue(); err != nil {
			return 0, r.pgErr(errPostgres, "after enqueue", fmt.Errorf("%w: %w", errHook, err))
		}
	}
	if len(bad) > 0 {
		if err := r.ops.MarkInvalid(ctx, tx, bad, badEr); err != nil {
			return 0, r.pgErr(errPostgres, "mark invalid rows dead", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, r.pgErr(errPostgres, "commit", err)
	}

	var added, dup, repl int
	for _, st := range statuses {
		for _, s := range st {
			switch s {
			case dispatch.Added:
				added++
			case dispatch.Duplicate:
				dup++
			case dispatch.Replaced:
				repl++
			}
		}
	}
	r.observe(ctx, relayobs.MoveEvent{Added: added, Duplicate: dup, Replaced: repl, Invalid: len(bad),
		Tasks: batches, Start: start, Duration: time.Since(start)})
	if len(bad) > 0 {
		r.cfg.Logger.Error("relay: rows Redis refuses were set dead", "rows", len(bad),
			"first", badID[0], "error", badEr[0])
	}
	r.sawQueues(batches)
	return len(rows), nil
}

// enqueue moves a round's tasks into Redis, each queue's routed by the shard count
// Postgres holds (TakeDue returns it with the rows), never by a count Redis may
// have lost: after a Redis loss a Client finds no count and would take 1 shard,
// and the round would put every task into shard 0 (issue 29). The workers claim
// by the count Redis holds, so when it is not Postgres's (lost, or a change whose
// mirror write has not landed) the controls are mirrored first; a shard that
// refuses the count (ErrShardCount: it holds another) gets them mirrored too, and
// the calls go once more.
func (r *Relay) enqueue(ctx context.Context, tx pgx.Tx, batches []dispatch.QueueTasks) ([][]dispatch.EnqueueStatus, error) {
	for _, b := range batches {
		if b.Shards == 0 {
			continue // the role may not read the counts: routed by Redis's
		}
		// (An error is Redis down: the enqueue below reports it.)
		if n, err := r.dq.Shards(ctx, b.Queue); err == nil && n != b.Shards {
			r.mirrorControls(ctx)
			break
		}
	}
	statuses, err := r.ops.Move(ctx, tx, batches)
	if errors.Is(err, dispatch.ErrShardCount) {
		r.mirrorControls(ctx)
		statuses, err = r.ops.Move(ctx, tx, batches)
	}
	return statuses, err
}

// mirrorControls writes the queue controls from Postgres into Redis now, as the
// control loop does every ControlSyncInterval, at most once a second for the
// rounds: a Redis whose controls cannot take Postgres's (a newer version there)
// must not cost every round a sync.
func (r *Relay) mirrorControls(ctx context.Context) {
	now := time.Now().UnixNano()
	last := r.mirrored.Load()
	if now-last < int64(time.Second) || !r.mirrored.CompareAndSwap(last, now) {
		return
	}
	if err := r.syncControls(ctx); err != nil {
		r.warnStore("relay: mirror queue controls before a round", err)
	}
}

// take marks due rows queued and returns them, in one round trip with the
// round's commit made asynchronous: the commit returns without waiting for the
// WAL flush, so the next round starts a disk flush sooner. Losing such a commit
// in a crash is harmless: its rows are pending again, and the next round
// enqueues them again, which Redis reports as duplicates. No finished state can
// depend on a lost round: every later change of these rows (a completion, a
// failure, a reap) locks the row after the round committed, so its own commit
// record follows the round's in the WAL, and flushing it makes the round durable
// too (docs/DESIGN.md, "Write orders").
func (r *Relay) take(ctx context.Context, tx pgx.Tx) ([]taskstate.Taken, error) {
	rows, err := r.ops.TakeDue(ctx, tx, transition.Take{
		Horizon: r.cfg.Horizon, Limit: r.cfg.BatchSize, Queues: r.cfg.Queues, Shards: !r.noShards.Load(),
	})
	if errors.Is(err, transition.ErrShardCounts) {
		return nil, r.mayNotReadShards(err)
	}
	return rows, err
}

// mayNotReadShards returns err, the error of a round's ShardedQueues. When the relay's
// role may not read delayq_queues (a role with the outbox's privileges alone,
// docs/SECURITY.md), the next rounds take the rows without their shard count and
// route by the count Redis holds, as before the rounds read Postgres's.
func (r *Relay) mayNotReadShards(err error) error {
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "42501" && strings.Contains(pe.Message, taskstate.QueuesTableName) {
		r.noShards.Store(true)
		r.cfg.Logger.Warn("relay: may not read the queue controls; rounds route sharded queues by the shard count Redis holds, "+
			"which a Redis loss takes away: grant SELECT on "+taskstate.QueuesTableName, "error", pe.Message)
	}
	return err
}

// sawQueues adds the queues a round moved tasks into to the reaper's list.
func (r *Relay) sawQueues(batches []dispatch.QueueTasks) {
	r.queuesMu.Lock()
	defer r.queuesMu.Unlock()
	for _, b := range batches {
		if !slices.Contains(r.registered, b.Queue) {
			r.registered = append(r.registered, b.Queue)
		}
	}
}

// untilNext returns how long until the next pending row comes within the
// horizon (the poll interval when there is none), and refreshes the lag gauge.
func (r *Relay) untilNext(ctx context.Context) (time.Duration, error) {
	var (
		next *time.Time
		now  time.Time
		err  error
	)
	if len(r.cfg.Queues) > 0 {
		err = r.pool.QueryRow(ctx, r.sql.NextDueQueues, r.cfg.Queues).Scan(&next, &now)
	} else {
		err = r.pool.QueryRow(ctx, r.sql.NextDue).Scan(&next, &now)
	}
	if err != nil {
		if ctx.Err() == nil {
			r.pgErr(errPostgres, "next due row", err) //nolint:errcheck // counted and logged
		}
		return 0, err
	}
	if next == nil {
		r.observe(ctx, relayobs.LagEvent{})
		return r.cfg.PollInterval, nil
	}
	r.observe(ctx, relayobs.LagEvent{Lag: max(0, now.Sub(*next))})
	// Rows within the horizon but locked by another relay look due now; waiting
	// at least a little keeps this loop from spinning on them.
	return max(next.Sub(now)-r.cfg.Horizon, r.cfg.BackoffMin), nil
}

// queues returns the queues the reaper visits: Config.Queues, or every queue of the
// Redis registry (each queue a task was enqueued into) and those with queued rows in
// Postgres, both read again every QueueRefresh, so that a queue with no recent
// activity is reaped too; a queue this relay moved a task into is added at once. A
// server that does not answer is counted and logged, and the queues the other gave
// are visited.
func (r *Relay) queues(ctx context.Context) []string {
	if len(r.cfg.Queues) > 0 {
		return r.cfg.Queues
	}
	r.queuesMu.Lock()
	fresh := !r.refreshed.IsZero() && time.Since(r.refreshed) < r.cfg.QueueRefresh
	queued, registered := r.queued, r.registered
	r.queuesMu.Unlock()
	if !fresh {
		if found, err := r.dq.RegisteredQueues(ctx); err != nil {
			r.redisErr(errReap, "registered queues", err) //nolint:errcheck // counted and logged
		} else {
			registered = found
		}
		if found, err := r.queuedQueues(ctx); err != nil {
			r.pgErr(errReap, "queues with queued rows", err) //nolint:errcheck // counted and logged
		} else {
			queued = found
		}
		r.queuesMu.Lock()
		r.queued, r.registered, r.refreshed = queued, registered, time.Now()
		r.queuesMu.Unlock()
	}
	all := append(slices.Clone(registered), queued...)
	slices.Sort(all)
	return slices.Compact(all)
}

// queuedQueues reads the queues with queued rows.
func (r *Relay) queuedQueues(ctx context.Context) ([]string, error) {
	rows, err := r.pool.Query(ctx, r.sql.QueuedQueues)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
