package faults

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// Environment of a child process (this test binary, re-executed).
const (
	envRole   = "DELAYQ_FAULTS_ROLE" // "worker" or "relay"
	envPG     = "DELAYQ_FAULTS_PG"
	envRedis  = "DELAYQ_FAULTS_REDIS"
	envPrefix = "DELAYQ_FAULTS_PREFIX"
	envName   = "DELAYQ_FAULTS_NAME"
	envQueues = "DELAYQ_FAULTS_QUEUES"
	// envDoneRetention is delayq.Config.DoneRetention (time.Duration's String;
	// empty: the default).
	envDoneRetention = "DELAYQ_FAULTS_DONE_RETENTION"
	// envGroupCommit is worker.GroupCommit.MaxTasks (empty: off).
	envGroupCommit = "DELAYQ_FAULTS_GROUP_COMMIT"
	// envShards splits every scenario's queues into this many shards
	// (system.shardQueues; empty: one shard).
	envShards = "DELAYQ_FAULTS_SHARDS"
	// envDie makes a relay kill itself with SIGKILL at a point of its Nth round:
	// "redis:N" right after the Redis write of the round returned, "commit:N" as
	// the round's COMMIT is about to be sent. Both are between the Redis write and
	// the Postgres commit.
	envDie = "DELAYQ_FAULTS_DIE"
)

// dyingLine is what a child prints just before it kills itself.
const dyingLine = "DYING "

// childMain runs a worker or relay process until SIGTERM (or SIGKILL).
func childMain(role string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	name := os.Getenv(envName)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("component", name)
	var err error
	switch role {
	case "worker":
		err = workerProcess(ctx, name, log)
	case "relay":
		err = relayProcess(ctx, log)
	case modelWorkerRole: // the model test's (model_test.go)
		err = modelWorkerProcess(ctx, name, log)
	case modelRelayRole:
		err = modelRelayProcess(ctx, log)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}

func workerProcess(ctx context.Context, name string, log *slog.Logger) error {
	queues := strings.Split(os.Getenv(envQueues), ",")
	pool, err := pgxpool.New(ctx, os.Getenv(envPG))
	if err != nil {
		return err
	}
	defer pool.Close()
	rdb, err := newRedis(os.Getenv(envRedis))
	if err != nil {
		return err
	}
	defer rdb.Close()
	doneRetention, err := time.ParseDuration(cmp.Or(os.Getenv(envDoneRetention), "0s"))
	if err != nil {
		return err
	}
	dq, err := newDelayq(rdb, os.Getenv(envPrefix), doneRetention)
	if err != nil {
		return err
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		return err
	}
	group, err := strconv.Atoi(cmp.Or(os.Getenv(envGroupCommit), "0"))
	if err != nil {
		return fmt.Errorf("bad %s: %w", envGroupCommit, err)
	}
	w, err := clientkit.NewClient(pool, dq, ob, workerConfig(log))
	if err != nil {
		return err
	}
	for _, q := range queues {
		if err := w.HandleTx(q, effectHandler(name), queueConfig(group)); err != nil {
			return err
		}
	}
	return w.Run(ctx)
}

func relayProcess(ctx context.Context, log *slog.Logger) error {
	pcfg, err := pgxpool.ParseConfig(os.Getenv(envPG))
	if err != nil {
		return err
	}
	pcfg.MaxConns = 4
	var hooks []redis.Hook
	if die := os.Getenv(envDie); die != "" {
		point, nth, ok := strings.Cut(die, ":")
		n, err := strconv.Atoi(nth)
		if !ok || err != nil || n < 1 {
			return fmt.Errorf("bad %s %q", envDie, die)
		}
		switch point {
		case "redis":
			hooks = append(hooks, &dieAfterPipeline{nth: int64(n)})
		case "commit":
			pcfg.ConnConfig.Tracer = &dieBeforeCommit{nth: int64(n)}
		default:
			return fmt.Errorf("bad %s %q", envDie, die)
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	rdb, err := newRedis(os.Getenv(envRedis), hooks...)
	if err != nil {
		return err
	}
	defer rdb.Close()
	doneRetention, err := time.ParseDuration(cmp.Or(os.Getenv(envDoneRetention), "0s"))
	if err != nil {
		return err
	}
	dq, err := newDelayq(rdb, os.Getenv(envPrefix), doneRetention)
	if err != nil {
		return err
	}
	r, err := relay.New(pool, dq.AsRedis(), relayConfig(log))
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// die announces the point on stdout and kills this process at once.
func die(point string) {
	fmt.Printf("%s%s\n", dyingLine, point)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// dieAfterPipeline kills the relay right after the Nth pipeline it sent to Redis
// succeeded: the relay pipelines only the enqueue scripts of a round, so the
// tasks are in Redis and their rows still pending, locked by an open transaction.
type dieAfterPipeline struct{ nth, n int64 }

func (h *dieAfterPipeline) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *dieAfterPipeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *dieAfterPipeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err == nil && atomic.AddInt64(&h.n, 1) == h.nth {
			die(fmt.Sprintf("after-redis-write round=%d", h.nth))
		}
		return err
	}
}

// dieBeforeCommit kills the relay as it is about to send its Nth COMMIT: only a
// round that moved rows commits, after its Redis write and its UPDATE.
type dieBeforeCommit struct{ nth, n int64 }

func (d *dieBeforeCommit) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.EqualFold(strings.TrimSpace(data.SQL), "commit") && atomic.AddInt64(&d.n, 1) == d.nth {
		die(fmt.Sprintf("before-commit round=%d", d.nth))
	}
	return ctx
}

func (d *dieBeforeCommit) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// child is one worker or relay process.
type child struct {
	name    string
	cmd     *exec.Cmd
	done    chan struct{} // closed once it exited and was waited for
	killed  atomic.Bool   // we sent it SIGKILL
	logPath string

	mu   sync.Mutex
	said []string // its stdout lines
}

// spawn starts this test binary as a child process in role.
func (s *system) spawn(role, name, dieAt string) (*child, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		envRole+"="+role, envName+"="+name, envPG+"="+s.pgURL, envRedis+"="+s.redisURL,
		envPrefix+"="+s.prefix, envQueues+"="+strings.Join(s.queues, ","), envDie+"="+dieAt,
		envDoneRetention+"="+s.doneRetention.String(), envGroupCommit+"="+strconv.Itoa(s.groupCommit))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c := &child{name: name, cmd: cmd, done: make(chan struct{}), logPath: filepath.Join(s.logDir, name+".log")}
	logf, err := os.Create(c.logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.mu.Lock()
			c.said = append(c.said, sc.Text())
			c.mu.Unlock()
		}
		_ = cmd.Wait()
		logf.Close()
		close(c.done)
	}()
	return c, nil
}

// kill sends SIGKILL; false when the process had exited already.
func (c *child) kill() bool {
	select {
	case <-c.done:
		return false
	default:
	}
	c.killed.Store(true)
	return c.cmd.Process.Signal(syscall.SIGKILL) == nil
}

// diedAt is the point where the child killed itself, or "".
func (c *child) diedAt() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.said {
		if p, ok := strings.CutPrefix(l, dyingLine); ok {
			return p
		}
	}
	return ""
}

// fleet keeps n child processes of one role running: a process that dies is
// started again after a short random pause. Each new process takes the next
// planned self-kill point, if any is left.
type fleet struct {
	s     *system
	role  string
	plans chan string
	slots []*atomic.Pointer[child]
	wg    sync.WaitGroup
	stop  func()

	kills      atomic.Int64 // SIGKILLs we sent
	selfKills  atomic.Int64 // processes that killed themselves at a planned point
	unexpected atomic.Int64 // exits nobody asked for

	mu     sync.Mutex
	points []string // where the self-killed processes died

	// down, while not nil, keeps the supervisors from starting processes until
	// it is closed (holdDown, release). Spawns take spawnMu, so that none slips
	// in between holdDown's check and its kills.
	spawnMu sync.Mutex
	down    chan struct{}
}

func (s *system) startFleet(role string, n int, plans ...string) *fleet {
	ctx, cancel := context.WithCancel(context.Background())
	f := &fleet{s: s, role: role, plans: make(chan string, len(plans))}
	for _, p := range plans {
		f.plans <- p
	}
	for i := range n {
		sl := &atomic.Pointer[child]{}
		f.slots = append(f.slots, sl)
		f.wg.Go(func() { f.supervise(ctx, i, sl) })
	}
	var once sync.Once
	f.stop = func() { once.Do(func() { cancel(); f.wg.Wait() }) }
	s.t.Cleanup(f.stop)
	return f
}

func (f *fleet) supervise(ctx context.Context, i int, sl *atomic.Pointer[child]) {
	for life := 0; ctx.Err() == nil; life++ {
		dieAt := ""
		select {
		case dieAt = <-f.plans:
		default:
		}
		f.spawnMu.Lock()
		if down := f.down; down != nil {
			f.spawnMu.Unlock()
			if dieAt != "" {
				f.plans <- dieAt
			}
			select {
			case <-down:
			case <-ctx.Done():
				return
			}
			continue
		}
		name := fmt.Sprintf("%s%d-%d", f.role, i, life)
		c, err := f.s.spawn(f.role, name, dieAt)
		if err == nil {
			sl.Store(c)
		}
		f.spawnMu.Unlock()
		if err != nil {
			f.s.t.Errorf("start %s: %v", name, err)
			return
		}
		select {
		case <-c.done:
		case <-ctx.Done():
			c.kill()
			<-c.done
			return
		}
		switch p := c.diedAt(); {
		case p != "":
			f.selfKills.Add(1)
			f.mu.Lock()
			f.points = append(f.points, p)
			f.mu.Unlock()
		case c.killed.Load():
			if dieAt != "" { // killed before its planned point: plan it again
				f.plans <- dieAt
			}
		default:
			f.unexpected.Add(1)
			f.s.t.Errorf("%s exited by itself (%v); log:\n%s", name, c.cmd.ProcessState, readTail(c.logPath, 3000))
		}
		if !pause(ctx, between(0, 300*time.Millisecond)) {
			return
		}
	}
}

// holdDown SIGKILLs every process of the fleet and starts none until release:
// when it returns, none runs.
func (f *fleet) holdDown() {
	f.spawnMu.Lock()
	if f.down == nil {
		f.down = make(chan struct{})
	}
	f.spawnMu.Unlock()
	for _, sl := range f.slots {
		if c := sl.Load(); c != nil {
			if c.kill() {
				f.kills.Add(1)
			}
			<-c.done
		}
	}
}

// release lets the supervisors start processes again after holdDown.
func (f *fleet) release() {
	f.spawnMu.Lock()
	if f.down != nil {
		close(f.down)
		f.down = nil
	}
	f.spawnMu.Unlock()
}

// killRandom SIGKILLs the process of a random slot (its supervisor starts a new
// one); false when none was running.
func (f *fleet) killRandom() bool {
	start := rand.IntN(len(f.slots))
	for k := range f.slots {
		if c := f.slots[(start+k)%len(f.slots)].Load(); c != nil && c.kill() {
			f.kills.Add(1)
			return true
		}
	}
	return false
}

// dumpChildLogs prints the tails of the child processes' logs that say anything.
func (s *system) dumpChildLogs() {
	paths, _ := filepath.Glob(filepath.Join(s.logDir, "*.log"))
	sort.Strings(paths)
	shown := 0
	for _, p := range paths {
		if tl := readTail(p, 1500); strings.TrimSpace(tl) != "" && shown < 12 {
			s.t.Logf("log of %s (tail):\n%s", filepath.Base(p), tl)
			shown++
		}
	}
}

func readTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return tail(string(b), n)
}
