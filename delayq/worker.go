package delayq

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/downlog"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/transition"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// Task is one run of a task, as a handler sees it.
type Task struct {
	// Queue and ID are the task's business identity.
	Queue string
	ID    string
	// Payload is the producer's payload, as enqueued.
	Payload []byte
	// Attempt counts this run: 1 on the first. Runs interrupted by a shutdown are
	// not counted.
	Attempt int
	// MaxAttempts is the run after which a failure makes the task dead (the task's
	// own limit, capped by QueueConfig.MaxAttempts).
	MaxAttempts int
	// Version is the outbox version of the task (bumped by each reschedule).
	Version int
	// Due is when the task was due, ClaimedAt when this run was claimed, both by the
	// Redis clock. Resumed is set when the task fell due while its queue was
	// paused: the queue's resume. The claim lateness is ClaimedAt minus the later
	// of Due and Resumed: time paused is no worker's lateness.
	Due       time.Time
	ClaimedAt time.Time
	Resumed   time.Time
	// TraceContext is the trace context stored at enqueue (outbox
	// Config.TraceContext), opaque to the worker: package delayqotel's observer
	// continues the trace from it. "" when none was stored.
	TraceContext string
	// StartBy is the task's start deadline (zero: none); a task claimed after
	// it never reaches its handler (QueueConfig.OnMissedDeadline).
	StartBy time.Time
}

// IdempotencyKey is the key to pass to external systems (a payment provider's
// Idempotency-Key header, say) so that they apply a plain handler's effect once
// even when the task runs more than once: "<queue>/<id>". It is the same for every
// attempt and version of the task. (Queue names never contain '/'.)
func (t *Task) IdempotencyKey() string { return t.Queue + "/" + t.ID }

// txHandler is a transactional handler: it writes its effect through tx, and the
// worker commits those writes together with the task's completion in the outbox,
// so the effect is applied exactly once. It must not commit or roll back tx (both
// return ErrTxOwned and fail the run). An error (or a panic) rolls everything back
// and the task is retried.
type txHandler func(ctx context.Context, tx pgx.Tx, t *Task) error

// plainHandler is a plain handler for effects outside Postgres. It runs at least once
// per task (more after a crash or an expired lease): pass t.IdempotencyKey() on.
// The completion is still recorded in the outbox after it returns nil.
type plainHandler func(ctx context.Context, t *Task) error

// worker claims tasks of the queues it has handlers for and runs them. Create it
// with New, register handlers with Handle and HandleTx, then call Run.
type worker struct {
	pool outbox.DB
	dq   *dispatch.Client
	ob   *outbox.Client
	cfg  WorkerConfig
	log  *slog.Logger
	// pg and rd log an outage of either store once per change of state, for
	// every loop of the worker (claims, wake-ups, heartbeats, completions,
	// the dead-hook sweep): downlog.
	pg, rd *downlog.Tracker

	store *taskstate.Store // the outbox's statements, for reads and the dead-hook sweep
	ops   *transition.Ops  // the transitions of a run

	stats counters
	obs   Observer      // Config.Observer and the Prometheus observer; never nil
	prom  *promObserver // the Prometheus observer, nil without Config.Registerer
	// sweep runs the OnDead hooks of deaths recorded without them, while Run
	// runs, when a queue has a hook (sweep.go).
	sweep atomic.Pointer[sweeper]
	hooks hooks
	// While Run runs, completions feeds the batch recorder of plain runs and acks
	// the batch acknowledger of successful runs in Redis (completer.go).
	// completions is buffered (maxBatch): a plain run's goroutine hands its run
	// over and returns to the pool without waiting for a batch being written.
	completions chan *run
	acks        chan []ackItem
	aside       sync.WaitGroup // the recorder's runs settled aside (settleAside)
	// beats renews the leases of the runs in flight while Run runs.
	beats *heartbeats

	mu      sync.Mutex
	queues  map[string]*queue
	prio    []*prioGroup // Prioritize's groups
	running bool
}

// hooks let tests inject faults and observe runs; nil fields do nothing.
type hooks struct {
	// beforeAck runs after the completion committed; an error skips the Redis ack
	// as if it had failed.
	beforeAck func(t *Task) error
	// finished runs after each run's bookkeeping, with its outcome.
	finished func(t *Task, o outcome)
	// workerKeep, when set, replaces workerKeep (registry.go); noGoodbye leaves
	// the registry entry behind when Run ends, as a killed process does.
	workerKeep time.Duration
	noGoodbye  bool
}

// outcome is how a run ended.
type outcome string

const (
	outSucceeded      = outcome(OutcomeSucceeded)
	outSuppressed     = outcome(OutcomeSuppressed)
	outRetried        = outcome(OutcomeRetried)
	outDead           = outcome(OutcomeDead)
	outLeaseLost      = outcome(OutcomeLeaseLost)
	outReleased       = outcome(OutcomeReleased)
	outStale          = outcome(OutcomeStale)
	outSnoozed        = outcome(OutcomeSnoozed)
	outCancelled      = outcome(OutcomeCancelled)
	outMissedDeadline = outcome(OutcomeMissedDeadline)
	outError          = outcome(OutcomeError) // bookkeeping failed; the lease will expire
	// outPending: the run was handed to the completion stages, which end it.
	outPending = outcome("pending")
)

type queue struct {
	name string
	cfg  QueueConfig
	handlers
	// mws is the run's middleware: the worker's Recover, Config.Middleware,
	// QueueConfig.Middleware.
	mws   []Middleware
	group *groups // while Run runs, with QueueConfig.GroupCommit
	// prio is the queue's priority group (Prioritize), whose loop claims for it;
	// nil: the queue's own claimLoop.
	prio *prioGroup
}

// newWorker returns a Worker that runs tasks from Redis (dq), records their completion
// in the outbox (ob) on pool (a *pgxpool.Pool, or anything that is a DB), and
// configures itself from cfg (completed with WithDefaults and validated).
func newWorker(pool outbox.DB, dq *dispatch.Client, ob *outbox.Client, cfg WorkerConfig) (*worker, error) {
	if pool == nil || dq == nil || ob == nil {
		return nil, fmt.Errorf("%w: nil pool, delayq client or outbox client", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var (
		prom  Observer
		promO *promObserver
	)
	if cfg.Registerer != nil {
		p, err := newPromObserver(cfg.Registerer)
		if err != nil {
			return nil, fmt.Errorf("worker: register metrics: %w", err)
		}
		prom, promO = p, p
	}
	obs := observers(prom, cfg.Observer)
	if obs == nil {
		obs = nopObserver{}
	}
	store := taskstate.New(taskstate.Config{
		Schema: ob.Config().Schema, NotifyChannel: ob.Config().NotifyChannel,
		NotifyWithin: ob.Config().NotifyWithin, ClearPayloadOnDone: ob.Config().ClearPayloadOnDone,
	})
	return &worker{
		pool: pool, dq: dq, ob: ob, cfg: cfg, log: cfg.Logger,
		pg: downlog.New(cfg.Logger, "worker", "PostgreSQL"), rd: downlog.New(cfg.Logger, "worker", "Redis"),
		store: store, ops: transition.New(store, dq),
		obs:    obs,
		prom:   promO,
		queues: make(map[string]*queue),
	}, nil
}

// handlers counts the registered queues.
func (w *worker) handlers() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.queues)
}

// Config returns the effective configuration (defaults applied).
func (w *worker) Config() WorkerConfig { return w.cfg }

// HandleTx registers a transactional handler for queue, with its configuration
// (zero value: defaults). Register before Run.
func (w *worker) HandleTx(queue string, h txHandler, cfg QueueConfig) error {
	if h == nil {
		return fmt.Errorf("%w: nil handler for queue %q", ErrInvalidConfig, queue)
	}
	return w.register(queue, cfg, handlers{tx: h})
}

// Handle registers a plain (at-least-once) handler for queue, with its
// configuration (zero value: defaults). Register before Run.
func (w *worker) Handle(queue string, h plainHandler, cfg QueueConfig) error {
	if h == nil {
		return fmt.Errorf("%w: nil handler for queue %q", ErrInvalidConfig, queue)
	}
	return w.register(queue, cfg, handlers{plain: h})
}

// handlers is a queue's handler: one of them is set.
type handlers struct {
	tx    txHandler
	plain plainHandler
	sql   sqlTxHandler
	sqlDB *sql.DB // sql's
}

func (w *worker) register(name string, cfg QueueConfig, h handlers) error {
	if err := validate.Queue(name); err != nil {
		return err
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("queue %q: %w", name, err)
	}
	if h.tx == nil && cfg.GroupCommit.enabled() {
		// A plain handler's completions are batched already (completer.go); a
		// database/sql transaction cannot share a pgx connection's.
		return fmt.Errorf("%w: queue %q: GroupCommit is for pgx transactional handlers (HandleTx, RegisterTx)", ErrInvalidConfig, name)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running {
		return fmt.Errorf("%w: register queue %q before Run", ErrRunning, name)
	}
	if _, ok := w.queues[name]; ok {
		return fmt.Errorf("%w: queue %q already has a handler", ErrInvalidConfig, name)
	}
	mws := append([]Middleware{Recover(w.log)}, w.cfg.Middleware...)
	w.queues[name] = &queue{name: name, cfg: cfg, handlers: h, mws: append(mws, cfg.Middleware...)}
	return nil
}

// Stats returns the worker's counts since New.
func (w *worker) Stats() RunStats { return w.stats.snapshot() }

// Run claims and runs tasks of the registered queues until ctx is cancelled, then
// shuts down gracefully: it stops claiming, lets the handlers in flight finish
// within Config.ShutdownTimeout, then cancels the contexts of the others (cause
// ErrShutdown) and, once they have returned, gives their leases back so the tasks
// run again at once. Run returns nil after a shutdown; handlers must return when
// their context is cancelled, Run waits for them.
//
// While tasks are due, each queue claims as many as it has free slots, without
// pause. When none is due, it sleeps until the next falls due or an earlier one is
// enqueued (delayq.Waiter): no polling. A queue whose rate limit (set with
// `delayq queue limit`) refuses a start sleeps until the claim script says the
// next start is allowed; the other queues go on.
//
// A schema whose outbox table does not exist (the migrations have not run)
// ends Run at once with outbox.ErrNotMigrated.
func (w *worker) Run(ctx context.Context) error {
	// Every completion would fail on a table that is not there. (A server that
	// cannot be reached yet is the claim loop's to wait for.)
	if err := w.ob.CheckMigrated(ctx, w.pool); errors.Is(err, outbox.ErrNotMigrated) {
		return fmt.Errorf("worker: %w", err)
	}
	w.mu.Lock()
	if w.running {
		w.mu.Unlock()
		return ErrRunning
	}
	if len(w.queues) == 0 {
		w.mu.Unlock()
		return ErrNoHandlers
	}
	w.running = true
	queues := make([]*queue, 0, len(w.queues))
	for _, q := range w.queues {
		queues = append(queues, q)
	}
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.running = false
		w.mu.Unlock()
	}()
	sort.Slice(queues, func(i, j int) bool { return queues[i].name < queues[j].name })

	waiter := w.dq.NewWaiter()
	defer waiter.Close()
	// Handlers run under hard, which outlives ctx by the shutdown timeout.
	hard, hardCancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer hardCancel(nil)

	// Both stages and the heartbeats stop after every run has returned, and the
	// process leaves the worker registry.
	defer w.startStages()()
	defer w.startRegistry(ctx, queues)()

	var loops sync.WaitGroup
	runs := newRunners(runnerIdle)
	for _, q := range queues {
		if q.tx != nil && q.cfg.GroupCommit.enabled() {
			q.group = newGroups(w, q, hard)
		}
	}
	loops.Go(func() { w.registerQueues(ctx, queues) }) // beside the claims: a slow Redis delays none
	for _, q := range queues {
		if q.prio == nil {
			loops.Go(func() { w.claimLoop(ctx, hard, waiter, q, runs) })
		}
	}
	for _, g := range w.prio {
		loops.Go(func() { w.groupLoop(ctx, hard, waiter, g, runs) })
	}
	if s := newSweeper(w, queues); s != nil {
		w.sweep.Store(s)
		loops.Go(func() { s.listen(ctx) })
		loops.Go(func() { s.loop(ctx) })
	}
	w.log.Info("worker: started", "queues", len(queues), "lease", w.cfg.Lease)
	<-ctx.Done()
	loops.Wait() // no claim after this: no more runs
	runs.stop()
	for _, q := range queues {
		if q.group != nil {
			q.group.close()
		}
	}

	done := make(chan struct{})
	go func() {
		runs.wait()
		for _, q := range queues {
			if q.group != nil {
				q.group.wait()
			}
		}
		close(done)
	}()
	if inFlight := w.stats.inFlight.Load(); inFlight > 0 {
		w.log.Info("worker: shutting down", "in_flight", inFlight, "timeout", w.cfg.ShutdownTimeout)
	}
	if w.cfg.ShutdownTimeout > 0 {
		t := time.NewTimer(w.cfg.ShutdownTimeout)
		select {
		case <-done:
		case <-t.C:
		}
		t.Stop()
	}
	hardCancel(ErrShutdown)
	<-done
	w.log.Info("worker: stopped")
	return nil
}

// startStages starts the batch recorder and acknowledger (completer.go) and the
// heartbeats (heartbeat.go), and returns the function that stops them, once no
// run is left.
func (w *worker) startStages() (stop func()) {
	w.completions, w.acks = make(chan *run, maxBatch), make(chan []ackItem)
	w.beats = newHeartbeats(w)
	recorded, acked, beaten := make(chan struct{}), make(chan struct{}), make(chan struct{})
	bctx, stopBeats := context.WithCancel(context.Background())
	go func() { batches(w.completions, w.recordBatch); close(recorded) }()
	go func() { batches(w.acks, w.ackBatch); close(acked) }()
	go func() { w.beats.loop(bctx); close(beaten) }()
	return func() {
		close(w.completions)
		<-recorded
		w.aside.Wait()
		close(w.acks)
		<-acked
		stopBeats()
		<-beaten
	}
}

// claimLoop claims the tasks of q while ctx lasts and starts a run for each.
func (w *worker) claimLoop(ctx, hard context.Context, waiter *dispatch.Waiter, q *queue, runs *runners) {
	slots := newQueueSlots(q.cfg.Concurrency, claimCoalesce)
	defer slots.close()
	free := slots.free
	backlog := false // the last claim left tasks due
	for {
		n := slots.take(ctx, backlog)
		if n == 0 || ctx.Err() != nil {
			free(n)
			return
		}
		// Mark before the claim, so an enqueue between the claim and the wait
		// still wakes us.
		mark, err := waiter.Mark(ctx, q.name)
		if err != nil {
			free(n)
			if ctx.Err() != nil {
				return
			}
			w.storeFailed(w.rd, "subscribe to wake-ups", err, "queue", q.name)
			w.pause(ctx)
			continue
		}
		// The claim outlives ctx: tasks leased by a claim whose reply we lost would
		// wait for their lease to expire.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.OpTimeout)
		cl, err := w.dq.Claim(cctx, q.name, n, w.cfg.Lease)
		cancel()
		w.obs.Claim(ctx, ClaimEvent{Queue: q.name, Asked: n, Claimed: len(cl.Tasks), Err: err})
		if err != nil {
			free(n)
			w.storeFailed(w.rd, "claim", err, "queue", q.name)
			w.pause(ctx)
			continue
		}
		w.rd.OK()
		free(n - len(cl.Tasks))
		backlog = len(cl.Tasks) > 0 && cl.NextDue == 0 && cl.RateWait == 0
		for _, ct := range cl.Tasks {
			slot := sync.OnceFunc(func() { free(1) })
			if q.group != nil && !ct.Missed { // a missed task runs nothing: settled alone
				q.group.add(w.startRun(hard, q, ct, cl.Now, slot))
				continue
			}
			runs.Go(func() { w.start(hard, q, ct, cl.Now, slot) })
		}
		var wait time.Duration
		switch {
		case cl.RateWait > 0:
			// The queue's rate limit allows no further start yet: sleep exactly
			// until the script says it will (not approach's earlier claim, which
			// would be refused). A changed limit or a pause wakes us.
			wait = cl.RateWait
		case cl.NextDue != 0:
			// Nothing more is due: sleep until the next task falls due (or a little
			// before, see approach) or an earlier one arrives. (A free slot does
			// not matter until then.)
			wait = approach(cl.NextDue)
		}
		if wait != 0 {
			if err := waiter.Wait(ctx, mark, wait); err != nil && ctx.Err() == nil {
				w.storeFailed(w.rd, "wait", err, "queue", q.name)
				w.pause(ctx)
			}
		}
	}
}

// registerQueues adds the worker's queues to Redis's queue registry, so that the
// dashboard and delayq stats list a queue before its first task (and it can be
// paused then). A failure (a Redis ACL without SADD, a Redis not up yet) is only
// logged: the registry is a listing, and the first enqueue registers the queue.
func (w *worker) registerQueues(ctx context.Context, queues []*queue) {
	names := make([]string, len(queues))
	for i, q := range queues {
		names[i] = q.name
	}
	if err := w.dq.Register(ctx, names...); err != nil {
		w.log.Warn("worker: queues not registered: the dashboard lists them once they have a task", "err", err)
	}
}

// claimCoalesce is how long a queue with a backlog waits for more of its slots to
// come free before it claims (queueSlots.take): a claim of several tasks costs
// Redis little more than a claim of one, and without the wait a backlog drained by
// handlers that end one by one is claimed a freed slot at a time. A due task waits
// at most this long for its claim, and only while older tasks are still due.
const claimCoalesce = time.Millisecond

// queueSlots is a queue's concurrency: a token in ch is a running handler (or a
// slot reserved for a claim).
type queueSlots struct {
	ch     chan struct{}
	wait   time.Duration // claimCoalesce
	target int           // the slots a coalescing take waits for: a quarter
	timer  *time.Timer   // reused by every take: no timer per claim
}

func newQueueSlots(size int, wait time.Duration) *queueSlots {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &queueSlots{ch: make(chan struct{}, size), wait: wait, target: max(1, size/4), timer: t}
}

// take blocks until at least one slot is free (or ctx is done: 0), then takes every
// free slot. With coalesce (the queue has a backlog) and fewer than a quarter of
// the slots free, it first waits up to s.wait for that many.
func (s *queueSlots) take(ctx context.Context, coalesce bool) int {
	select {
	case s.ch <- struct{}{}:
	case <-ctx.Done():
		return 0
	}
	n := 1 + s.takeFree(cap(s.ch)-1)
	if coalesce && n < s.target {
		s.timer.Reset(s.wait)
	wait:
		for n < s.target {
			select {
			case s.ch <- struct{}{}:
				n++
			case <-s.timer.C:
				break wait
			case <-ctx.Done():
				break wait
			}
		}
		s.timer.Stop()
		n += s.takeFree(cap(s.ch) - n)
	}
	return n
}

// takeFree takes up to max slots that are free now, without waiting.
func (s *queueSlots) takeFree(max int) int {
	n := 0
	for n < max {
		select {
		case s.ch <- struct{}{}:
			n++
		default:
			return n
		}
	}
	return n
}

// free gives n slots back.
func (s *queueSlots) free(n int) {
	for range n {
		<-s.ch
	}
}

func (s *queueSlots) close() { s.timer.Stop() }

// approach shortens a wait for the next due time, so that the claim at that time
// does not pay for waking an idle machine. On a 2-core virtual machine a Redis round
// trip after a second of idling took 5-14 ms, after 50 ms 0.5-1.4 ms, after 5 ms
// 0.1-0.2 ms (BENCHMARKS.md, "lateness"). So a wait ends 50, 10 or 2 ms early, by
// its length, with a claim that finds nothing due yet and returns a fresh NextDue:
// at most three more claims per long wait, none while tasks fall due more often than
// every 3 ms. Waits past Config.MaxWait are cut to it by the Waiter anyway.
func approach(d time.Duration) time.Duration {
	switch {
	case d > 60*time.Millisecond:
		return d - 50*time.Millisecond
	case d > 12*time.Millisecond:
		return d - 10*time.Millisecond
	case d > 3*time.Millisecond:
		return d - 2*time.Millisecond
	}
	return d
}

// storeFailed logs err of op on store t: an outage once per change of state
// (downlog), an error the server answered as "worker: <op> failed" each time.
func (w *worker) storeFailed(t *downlog.Tracker, op string, err error, attrs ...any) {
	if !t.Report(op, err) {
		w.log.Warn("worker: "+op+" failed", append(attrs, "err", err)...)
	}
}

func (w *worker) pause(ctx context.Context) {
	t := time.NewTimer(w.cfg.ErrorPause)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
