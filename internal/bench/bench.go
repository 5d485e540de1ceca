// Package bench runs the benchmark workloads of `delayq bench`: each answers one
// question a user choosing a delayed-task system asks (how fast do I enqueue in my
// transactions, how fast does a backlog drain, how close to its due time does a
// task start, what does it cost in memory) on real servers, with the machine and
// versions recorded beside the figures.
//
// Every workload runs in a schema and key prefix of its own and removes them after,
// so it can run against servers that hold other data. Scale shrinks the sizes
// (CI runs every workload at a tiny scale and checks counts, never speed).
package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/migrations"
	"github.com/delayq/delayq/outbox"
)

// Env names the servers a run uses.
type Env struct {
	DatabaseURL string
	RedisURL    string
	// Scale multiplies every workload's task count (1 = the documented size).
	Scale float64
	// WorkerBinary, when set, is a delayq binary the recovery workload runs as a
	// worker process it can SIGKILL. Empty skips the process part.
	WorkerBinary string
	// RateBurst is the rate-limit workload's burst (0: the default).
	RateBurst int
	// ClaimControls gives the "bench" queue a rate limit that never binds
	// (10^6 starts/s), so that drain and lateness measure the claim script with
	// its limiter at work (the controls read, the GCRA step and its write).
	ClaimControls bool
	// Shards is the sharded workload's shard count (0: 3).
	Shards int
	// RelayRate is the relay workload's steady load, tasks committed a second
	// for 10 s while its lag is measured (0: 2,000).
	RelayRate int
	// Soak shapes the soak workload (zero: its documented size).
	Soak   Soak
	Logger *slog.Logger
}

// Figure is one measured number.
type Figure struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
}

// Result is one workload's outcome.
type Result struct {
	Workload string         `json:"workload"`
	Params   map[string]any `json:"params"`
	Figures  []Figure       `json:"figures"`
	Machine  Machine        `json:"machine"`
	// Checks are correctness counts (e.g. handler calls == tasks); a run whose
	// checks fail returns an error as well.
	Checks map[string]int64 `json:"checks,omitempty"`
}

func (r *Result) add(name string, v float64, unit string) {
	r.Figures = append(r.Figures, Figure{Name: name, Value: v, Unit: unit})
}

// Machine describes where the figures were taken.
type Machine struct {
	Cores    int    `json:"cores"`
	CPU      string `json:"cpu"`
	Go       string `json:"go"`
	Postgres string `json:"postgres"`
	Redis    string `json:"redis"`
	Durable  string `json:"postgres_fsync"`
}

// workload is one benchmark.
type workload struct {
	about string
	run   func(ctx context.Context, s *session, r *Result) error
}

// Workloads lists the workload names in the order `delayq bench` runs them.
func Workloads() []string {
	reg := registry()
	names := make([]string, 0, len(reg))
	for n := range reg {
		names = append(names, n)
	}
	order := make(map[string]int)
	for i, n := range []string{"enqueue-tx", "enqueue-tx-soon", "enqueue-tx-soon-each", "enqueue-tx-held",
		"enqueue-tx-held-off", "enqueue-batch", "enqueue-tx-sql", "enqueue-tx-soon-sql", "enqueue-batch-sql",
		"relay", "drain-tx", "drain-tx-write", "drain-tx-group", "drain-tx-write-group", "drain-plain",
		"lateness", "lateness-steady", "memory", "recovery", "redis-loss", "redis-loss-restart",
		"redis-loss-failover", "sharded", "multi-db", "idle", "rate-limit", "priority", "fairness", "workflow", "bounds", "prune", "soak"} {
		order[n] = i
	}
	sort.Slice(names, func(i, j int) bool { return order[names[i]] < order[names[j]] })
	return names
}

// FullRun lists the workloads `delayq bench` runs when none is named: all but soak,
// which takes ten minutes, prune, which measures retention rather than a
// comparison, enqueue-tx-held-off, which measures a behaviour left behind, and
// multi-db, which starts four PostgreSQL servers and a cluster of its own: they
// run only by name.
func FullRun() []string {
	return slices.DeleteFunc(Workloads(), func(n string) bool {
		return n == "soak" || n == "prune" || n == "enqueue-tx-held-off" || n == "multi-db"
	})
}

// About describes a workload in one line.
func About(name string) string { return registry()[name].about }

// ErrUnknownWorkload is returned for a name Workloads does not list.
var ErrUnknownWorkload = errors.New("bench: unknown workload")

// Run runs one workload.
func Run(ctx context.Context, env Env, name string) (Result, error) {
	w, ok := registry()[name]
	if !ok {
		return Result{}, fmt.Errorf("%w %q (known: %s)", ErrUnknownWorkload, name, strings.Join(Workloads(), ", "))
	}
	if env.Scale <= 0 {
		env.Scale = 1
	}
	if env.Logger == nil {
		env.Logger = slog.New(slog.DiscardHandler)
	}
	s, err := newSession(ctx, env, name)
	if err != nil {
		return Result{}, err
	}
	defer s.close()
	r := Result{Workload: name, Params: map[string]any{"scale": env.Scale}, Machine: s.machine(ctx)}
	if env.ClaimControls {
		rate := validate.RateLimit{Limit: 1_000_000, Period: time.Second}
		c, err := s.setRateLimit(ctx, "bench", rate)
		if err != nil {
			return r, fmt.Errorf("bench %s: rate limit: %w", name, err)
		}
		r.Params["bench_queue_rate_limit"] = c.Rate.String()
	}
	if err := w.run(ctx, s, &r); err != nil {
		return r, fmt.Errorf("bench %s: %w", name, err)
	}
	return r, nil
}

// session is one workload's isolated corner of the servers.
type session struct {
	env    Env
	pool   *pgxpool.Pool
	rdb    *redis.Client
	schema string
	prefix string
	ob     *outbox.Client
	dq     *dispatch.Client
}

func newSession(ctx context.Context, env Env, name string) (*session, error) {
	suffix := fmt.Sprintf("%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	s := &session{env: env,
		schema: "bench_" + strings.ReplaceAll(name, "-", "_") + "_" + suffix}
	pcfg, err := pgxpool.ParseConfig(env.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	pcfg.MaxConns = 64
	pcfg.ConnConfig.RuntimeParams["search_path"] = s.schema
	if s.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return nil, err
	}
	opt, err := redis.ParseURL(env.RedisURL)
	if err != nil {
		s.pool.Close()
		return nil, fmt.Errorf("redis URL: %w", err)
	}
	opt.PoolSize = 64
	s.rdb = redis.NewClient(opt)
	if s.prefix, err = s.claimPrefix(ctx); err != nil {
		s.close()
		return nil, err
	}
	db := migrations.OpenDBFromPool(s.pool)
	defer db.Close()
	if _, err := migrations.Up(ctx, db, migrations.Config{Schema: s.schema}); err != nil {
		s.close()
		return nil, err
	}
	// Start from a checkpointed server, so that a checkpoint owed to the WAL of an
	// earlier workload does not flush the disk under this one. A role without the
	// right (pg_checkpoint, or superuser) just goes on.
	_, _ = s.pool.Exec(ctx, "CHECKPOINT")
	if s.ob, err = outbox.New(outbox.Config{Schema: s.schema}); err != nil {
		s.close()
		return nil, err
	}
	if s.dq, err = dispatch.New(s.rdb, dispatch.Config{Prefix: s.prefix}); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// claimPrefix picks a key prefix of two bytes, as long as the default "dq" (key
// length counts in the memory figure), that no other session holds: it owns the
// prefix while its "<prefix>:owner" key exists (deleteKeys removes it).
func (s *session) claimPrefix(ctx context.Context) (string, error) {
	const chars = "abcdefghijklmnopqrstuvwxyz0123456789"
	for range 200 {
		p := "b" + string(chars[rand.IntN(len(chars))])
		ok, err := s.rdb.SetNX(ctx, p+":owner", os.Getpid(), 24*time.Hour).Result()
		if err != nil {
			return "", fmt.Errorf("redis: %w", err)
		}
		if ok {
			return p, nil
		}
	}
	return "", fmt.Errorf("no free two-byte key prefix b? on this Redis: delete stale b?:owner keys")
}

func (s *session) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _ = s.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s.schema}.Sanitize()+" CASCADE")
	if s.prefix != "" {
		s.deleteKeys(ctx)
	}
	s.pool.Close()
	_ = s.rdb.Close()
}

func (s *session) deleteKeys(ctx context.Context) {
	iter := s.rdb.Scan(ctx, 0, s.prefix+":*", 5000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 5000 {
			s.rdb.Unlink(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		s.rdb.Unlink(ctx, keys...)
	}
}

// n scales a documented task count, never below a small floor.
func (s *session) n(full int) int {
	return max(10, int(float64(full)*s.env.Scale))
}

// timed is a workload's wall-clock span at this scale: a test-sized run (Scale
// below 0.1: tests run every workload to keep it from rotting) compresses time
// tenfold too, so that a minute's spread of due times does not hold a test for
// a minute.
func (s *session) timed(full time.Duration) time.Duration {
	if s.env.Scale < 0.1 {
		return full / 10
	}
	return full
}

func (s *session) machine(ctx context.Context) Machine {
	m := Machine{Cores: runtime.NumCPU(), CPU: cpuModel(), Go: runtime.Version()}
	_ = s.pool.QueryRow(ctx, "SHOW server_version").Scan(&m.Postgres)
	_ = s.pool.QueryRow(ctx, "SHOW fsync").Scan(&m.Durable)
	if info, err := s.rdb.Info(ctx, "server").Result(); err == nil {
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
				m.Redis = v
			}
		}
	}
	return m
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}
