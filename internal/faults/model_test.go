package faults

// The model-based test of the whole state machine (issue 16, deliverable 6).
//
// A seeded generator (model_gen_test.go) applies operations one at a time to a
// running system — a relay and two workers as child processes that it may SIGKILL,
// on servers of the test's own — and advances a reference model of the transition
// table of internal/taskstate by what each operation reports. The handlers'
// outcomes are chosen per (task, incarnation, version, attempt) by a pure function
// of the seed (plan), which the handlers in the child processes and the model
// compute alike. When the operations stop, the checker (model_check_test.go)
// waits for the system to settle and compares Postgres, Redis and the handlers'
// records (every run, every committed effect) with the model. Its features
// have files of their own: workflows (model_wf_test.go), batches
// (model_batch_test.go), concurrency keys with their caps and throttles, and
// replace/debounce (model_keys_test.go).
//
//	go test -race -count=1 -run TestModel ./internal/faults/        # short run, < 60s
//	DELAYQ_MODEL_SEED=1234 go test -run TestModel ./internal/faults/  # replay a seed
//	DELAYQ_MODEL_LONG=30m go test -run TestModel -timeout 40m ./internal/faults/
//
// A seed replays the same operations and handler outcomes; the timing of the
// servers and processes is not replayed, so a failure caused by a race may need
// a few runs of its seed.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
	"github.com/delayq/delayq/workflow"
)

// Environment of the model test.
const (
	// envModelSeed replays one run with this seed (a uint64).
	envModelSeed = "DELAYQ_MODEL_SEED"
	// envModelLong, a duration (30m), runs seeded runs one after the other for
	// that long instead of the short run.
	envModelLong = "DELAYQ_MODEL_LONG"
)

// Child roles of the model test (see childMain).
const (
	modelWorkerRole = "model-worker"
	modelRelayRole  = "model-relay"
)

// Timings of the model's system. Heartbeats are off, so a handler that runs
// longer than the lease loses it (the slow outcome); the horizon is short, so
// that a task beyond it is cheap to wait for.
const (
	modelLease     = 1500 * time.Millisecond
	modelSlow      = modelLease + 700*time.Millisecond // the slow handler outlives its lease
	modelHorizon   = 2 * time.Second
	modelPrefix    = "mq"
	modelShortOps  = 18 * time.Second // the short run's operation phase
	modelSettle    = 25 * time.Second // bound for every task to finish once the operations stop
	modelStaleWait = 4 * time.Second  // an older version may still start this long after a reschedule committed
)

// The model's queues: most operations use ma and mb; mc is sharded (3 shards at
// the start), takes bursts of tasks due now and has its shard count changed
// whenever it is empty (opShardedBurst, opReshard).
var (
	modelQueues     = []string{"ma", "mb", modelShardQueue}
	modelBusyQueues = []string{"ma", "mb"}
)

const modelShardQueue = "mc"

// SQL of the model's tables: its seed, every handler run (written outside the
// handler's transaction, so failed runs are recorded too) and every effect
// (written in the handler's transaction: it commits with the completion, or not
// at all). No unique constraints: duplicates must show.
const (
	sqlModelTables = `
CREATE TABLE model_config (seed numeric NOT NULL);
CREATE TABLE model_runs (
	queue text NOT NULL, task_id text NOT NULL, inc int NOT NULL, version int NOT NULL, attempt int NOT NULL,
	outcome text NOT NULL, worker text NOT NULL, due timestamptz NOT NULL, claimed_at timestamptz NOT NULL,
	started_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE model_effects (
	queue text NOT NULL, task_id text NOT NULL, inc int NOT NULL, version int NOT NULL, attempt int NOT NULL,
	worker text NOT NULL, payload text NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp());`
	sqlModelRun    = `INSERT INTO model_runs (queue, task_id, inc, version, attempt, outcome, worker, due, claimed_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`
	sqlModelEffect = `INSERT INTO model_effects (queue, task_id, inc, version, attempt, worker, payload) VALUES ($1, $2, $3, $4, $5, $6, $7)`
)

// outcomeKind is what a handler does on one run.
type outcomeKind int

const (
	oSuccess    outcomeKind = iota // writes its effect and returns nil
	oError                         // returns an error: retried after the backoff
	oRetryAfter                    // returns worker.RetryAfter
	oNoRetry                       // returns worker.NoRetry: dead at once
	oPanic                         // panics
	oSlow                          // sleeps past its lease, then writes its effect and returns nil
	oCancel                        // writes its effect, then returns worker.Cancel: cancelled, rolled back
)

func (o outcomeKind) String() string {
	return [...]string{"success", "error", "retry-after", "no-retry", "panic", "slow", "cancel"}[o]
}

// plan is the outcome of the run of task queue/id (incarnation inc) at version
// and attempt, and the RetryAfter delay: a pure function of the seed, computed
// alike by the handlers and by the model.
func plan(seed uint64, queue, id string, inc, version, attempt int) (outcomeKind, time.Duration) {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s|%s|%d|%d|%d", queue, id, inc, version, attempt)
	r := rand.New(rand.NewPCG(seed, h.Sum64()))
	d := time.Duration(100+r.IntN(500)) * time.Millisecond
	switch n := r.IntN(100); {
	case n < 55:
		return oSuccess, 0
	case n < 58:
		return oCancel, 0
	case n < 70:
		return oError, 0
	case n < 79:
		return oRetryAfter, d
	case n < 83:
		return oNoRetry, 0
	case n < 91:
		return oPanic, 0
	default:
		return oSlow, 0
	}
}

// modelPayload is the payload of incarnation inc of a task: an id reused after
// its row was deleted is a new incarnation, and its runs must be told apart.
func modelPayload(inc int) []byte { return []byte("inc=" + strconv.Itoa(inc)) }

// modelPriority is a task's priority within its queue, 0..9, a function of its id
// (not of the generator, so that a seed replays the operations it always did): the
// tasks of a queue are claimed in mixed priorities, which must change nothing of
// exactly once.
func modelPriority(id string) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % 10)
}

// modelResult is the result a run stores with its effect.
func modelResult(inc, version, attempt int) []byte {
	return fmt.Appendf(nil, "%d/%d/%d", inc, version, attempt)
}

func payloadInc(p []byte) int {
	s, _, _ := strings.Cut(string(p), ";") // a replace tags its payload: "inc=1;r=42"
	n, _ := strconv.Atoi(strings.TrimPrefix(s, "inc="))
	return n
}

var errPlanned = errors.New("model: planned failure")

// modelHandler runs the planned outcome; db records the run outside tx. A run
// that writes its effect stores its result too (workflow.Client.SetResult):
// the run's incarnation, version and attempt, which the checker finds on done
// rows alone, equal to their one effect's.
func modelHandler(name string, seed uint64, db *pgxpool.Pool, wf *workflow.Client) func(context.Context, pgx.Tx, *delayq.Task) error {
	return func(ctx context.Context, tx pgx.Tx, t *delayq.Task) error {
		inc := payloadInc(t.Payload)
		o, d := plan(seed, t.Queue, t.ID, inc, t.Version, t.Attempt)
		if _, err := db.Exec(ctx, sqlModelRun, t.Queue, t.ID, inc, t.Version, t.Attempt, o.String(), name, t.Due, t.ClaimedAt); err != nil {
			return fmt.Errorf("record the run: %w", err)
		}
		end, err := keyRunStart(ctx, db, t, name)
		if err != nil {
			return err
		}
		defer end()
		effect := func() error {
			if _, err := tx.Exec(ctx, sqlModelEffect, t.Queue, t.ID, inc, t.Version, t.Attempt, name, string(t.Payload)); err != nil {
				return err
			}
			if err := recordBatchCounts(ctx, tx, wf, t); err != nil {
				return err
			}
			return wf.SetResult(ctx, tx, t, modelResult(inc, t.Version, t.Attempt))
		}
		switch o {
		case oSuccess:
			return effect()
		case oError:
			return errPlanned
		case oRetryAfter:
			return delayq.RetryAfter(d, errPlanned)
		case oNoRetry:
			return delayq.NoRetry(errPlanned)
		case oPanic:
			panic("model: planned panic")
		case oCancel:
			if err := effect(); err != nil {
				return err
			}
			return delayq.Cancel(errPlanned)
		default: // oSlow: heartbeats are off, so the lease expires meanwhile
			if !pause(ctx, modelSlow) {
				return ctx.Err()
			}
			return effect()
		}
	}
}

// modelWorkerConfig is the configuration of the model's worker named name. The
// group-commit worker heartbeats: its runs wait for the handlers ahead of them in
// their group (a slow one among them), and without heartbeats their leases
// would run out meanwhile, which the model does not plan. (A slow run is one
// whose outcome the model does not predict, heartbeats or not.)
func modelWorkerConfig(log *slog.Logger, name string) delayq.WorkerConfig {
	hb := time.Duration(-1)
	if strings.HasPrefix(name, modelGroupWorker) {
		hb = modelLease / 3
	}
	return delayq.WorkerConfig{
		Lease: modelLease, HeartbeatInterval: hb, ShutdownTimeout: 2 * time.Second,
		OpTimeout: 3 * time.Second, ErrorPause: 100 * time.Millisecond, Logger: log,
	}
}

// modelGroupWorker names the model's worker that commits in groups (the second).
const modelGroupWorker = modelWorkerRole + "1-"

// modelQueueConfig is the queue configuration of the model's worker named name:
// the second worker commits its runs in groups (worker.GroupCommit), the first
// one by one, so that every run checks both paths against the same model.
func modelQueueConfig(name string) delayq.QueueConfig {
	cfg := delayq.QueueConfig{
		Concurrency: 4,
		Backoff:     delayq.Backoff{Base: 50 * time.Millisecond, Max: 200 * time.Millisecond},
	}
	if strings.HasPrefix(name, modelGroupWorker) {
		cfg.GroupCommit = delayq.GroupCommit{MaxTasks: 4, MaxWait: 5 * time.Millisecond}
	}
	return cfg
}

func modelRelayConfig(log *slog.Logger) relay.Config {
	return relay.Config{
		Horizon: modelHorizon, BatchSize: 50, PollInterval: 500 * time.Millisecond, RoundTimeout: 10 * time.Second,
		ReapInterval: reapInterval, Retention: -1, StatsInterval: -1,
		BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond, Logger: log,
	}
}

// modelWorkerProcess is a worker child of the model test. The seed comes from
// the database.
func modelWorkerProcess(ctx context.Context, name string, log *slog.Logger) error {
	pool, err := pgxpool.New(ctx, withParamURL(os.Getenv(envPG), "pool_max_conns", "12"))
	if err != nil {
		return err
	}
	defer pool.Close()
	// A worker started while the model's Postgres restarts after a crash
	// (opPostgresCrash) waits for it, with a bounded backoff (seed
	// 7734070036421367694: a worker started then exited on a refused dial).
	var seedText string
	giveUp := time.Now().Add(15 * time.Second)
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		err := pool.QueryRow(ctx, `SELECT seed::text FROM model_config`).Scan(&seedText)
		if err == nil {
			break
		}
		if time.Now().After(giveUp) || !pause(ctx, wait) {
			return fmt.Errorf("read the seed: %w", err)
		}
	}
	seed, err := strconv.ParseUint(seedText, 10, 64)
	if err != nil {
		return err
	}
	rdb, err := newRedis(os.Getenv(envRedis))
	if err != nil {
		return err
	}
	defer rdb.Close()
	dq, err := newDelayq(rdb, os.Getenv(envPrefix), 0) // DoneRetention: the default
	if err != nil {
		return err
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		return err
	}
	w, err := clientkit.NewClient(pool, dq, ob, modelWorkerConfig(log, name))
	if err != nil {
		return err
	}
	for _, q := range strings.Split(os.Getenv(envQueues), ",") {
		if err := w.HandleTx(q, modelHandler(name, seed, pool, workflow.New(ob)), modelQueueConfig(name)); err != nil {
			return err
		}
	}
	return w.Run(ctx)
}

// modelRelayProcess is a relay child of the model test.
func modelRelayProcess(ctx context.Context, log *slog.Logger) error {
	pool, err := pgxpool.New(ctx, withParamURL(os.Getenv(envPG), "pool_max_conns", "4"))
	if err != nil {
		return err
	}
	defer pool.Close()
	rdb, err := newRedis(os.Getenv(envRedis))
	if err != nil {
		return err
	}
	defer rdb.Close()
	dq, err := newDelayq(rdb, os.Getenv(envPrefix), 0)
	if err != nil {
		return err
	}
	r, err := relay.New(pool, dq.AsRedis(), modelRelayConfig(log))
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// withParamURL is withParam without a test.
func withParamURL(u, k, v string) string {
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return u + sep + k + "=" + v
}

// TestModel runs the model-based test: one short run, or with DELAYQ_MODEL_LONG
// seeded runs one after the other for that long.
func TestModel(t *testing.T) {
	t.Parallel()
	var seeds func(i int) uint64
	if s := os.Getenv(envModelSeed); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", envModelSeed, s, err)
		}
		seeds = func(i int) uint64 { return seed + uint64(i) }
	} else {
		seeds = func(int) uint64 { return rand.Uint64() }
	}
	long := time.Duration(0)
	if s := os.Getenv(envModelLong); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%s=%q: %v", envModelLong, s, err)
		}
		long = d
	}
	if long == 0 {
		runModel(t, seeds(0), modelShortOps)
		return
	}
	end := time.Now().Add(long)
	for i := 0; time.Now().Before(end); i++ {
		seed := seeds(i)
		ok := t.Run(fmt.Sprintf("run%03d-seed%d", i, seed), func(t *testing.T) {
			runModel(t, seed, 40*time.Second)
		})
		if !ok {
			break
		}
	}
}

// runModel is one seeded run: the system, the operations for opsTime, the check.
func runModel(t *testing.T, seed uint64, opsTime time.Duration) {
	t.Logf("model seed %d (replay: %s=%d)", seed, envModelSeed, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("MODEL FAILED: replay with %s=%d go test -race -count=1 -run TestModel ./internal/faults/", envModelSeed, seed)
			fmt.Printf("model: FAILED seed=%d\n", seed)
		}
	})
	own := testenv.OwnRedis(t)
	pg := testenv.OwnPostgres(t) // opPostgresCrash kills it
	s := newSystem(t, "model", pg.URL(), own.URL())
	s.prefix, s.queues = modelPrefix, modelQueues
	var err error
	if s.dq, err = newDelayq(s.rdb, s.prefix, 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), opsTime+modelSettle+60*time.Second)
	defer cancel()
	s.shardQueues(ctx, 0) // DELAYQ_FAULTS_SHARDS, if set
	if s.shards == 0 {
		ctl, err := queuectl.New(s.admin, s.dq, s.ob.Config().Schema)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ctl.SetShards(ctx, modelShardQueue, 3); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.admin.Exec(ctx, sqlModelTables); err != nil {
		t.Fatalf("model tables: %v", err)
	}
	if _, err := s.admin.Exec(ctx, sqlModelTransitions); err != nil {
		t.Fatalf("model transitions: %v", err)
	}
	if _, err := s.admin.Exec(ctx, sqlModelBatch); err != nil {
		t.Fatalf("model batches: %v", err)
	}
	if _, err := s.admin.Exec(ctx, sqlModelKeyRuns); err != nil {
		t.Fatalf("model key runs: %v", err)
	}
	if _, err := s.admin.Exec(ctx, `INSERT INTO model_config VALUES ($1::text::numeric)`, strconv.FormatUint(seed, 10)); err != nil {
		t.Fatal(err)
	}
	// The WAL writer flushes the relay's asynchronous commits every
	// wal_writer_delay: at its longest, a crash right after a round finds the
	// round unflushed (opPostgresCrash).
	for _, q := range []string{`ALTER SYSTEM SET wal_writer_delay = '10s'`, `SELECT pg_reload_conf()`} {
		if _, err := s.admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	m := newModel(s, seed)
	m.pg = pg
	m.setKeyLimits(ctx) // before any task: a cap set while tasks run does not count them
	m.relays = s.startFleet(modelRelayRole, 1)
	m.workers = s.startFleet(modelWorkerRole, 2)
	m.generate(ctx, opsTime)
	m.check(ctx)
}
