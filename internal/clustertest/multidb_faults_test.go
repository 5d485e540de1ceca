package clustertest

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// Environment of a child process of TestSeveralDatabasesFaults (this test
// binary, re-executed; TestMain hands it to multiDBChild).
const (
	envMDBRole     = "DELAYQ_MDB_ROLE" // "worker" or "relay"
	envMDBPG       = "DELAYQ_MDB_PG"
	envMDBCluster  = "DELAYQ_MDB_CLUSTER" // the cluster's node addresses, comma-separated
	envMDBPrefix   = "DELAYQ_MDB_PREFIX"
	envMDBDatabase = "DELAYQ_MDB_DATABASE"
	envMDBQueues   = "DELAYQ_MDB_QUEUES"
	envMDBName     = "DELAYQ_MDB_NAME"
)

// The fault suite's process scenarios (internal/faults: worker SIGKILL, relay
// SIGKILL, Redis loss) over a deployment of three outbox databases feeding one
// Redis Cluster of 3 masters: each database has its relay process and two worker
// processes (delayq.Config.Database), the same queues and the same task ids.
// While the producers commit tasks into every database, every database's first
// worker is killed with SIGKILL, then every relay, then the master serving the
// most queues loses its data (FLUSHALL, replicated to its replica). Per
// database: every committed task runs once in effect (nothing lost, nothing run
// twice), none before it was due, and its relay detected the loss by itself.
func TestSeveralDatabasesFaults(t *testing.T) {
	t.Parallel()
	rdb, cl := testenv.RedisCluster(t)
	prefix := testenv.ClusterPrefix(t, rdb)
	queues := queueNames()[:12]
	perMaster := byMaster(t, rdb, cl, queues)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	keys := []string{"eu1", "us1", "ap1"}
	dbs := make([]*faultDB, len(keys))
	for i, key := range keys {
		pg := ownPG(t)
		dbs[i] = &faultDB{key: key, pg: pg, procs: map[string]*mdbProc{}}
		t.Cleanup(func() {
			if t.Failed() {
				dbs[i].dumpLogs(t)
			}
		})
		for _, role := range []string{"relay", "w1", "w2"} {
			dbs[i].spawn(t, role, cl.Addrs(), prefix, queues)
		}
	}

	// Producers: transactions of 12 tasks (one a queue) 120ms apart into every
	// database, due now or up to 1.5s later, until the faults are over: each
	// fault lands while the load runs, however slow the machine.
	stopLoad := make(chan struct{})
	var wg sync.WaitGroup
	prodErr := make([]error, len(dbs))
	var prodMu sync.Mutex
	for i, d := range dbs {
		// A producer that failed ends the test's waits at once, with its error.
		d.failed = func() error {
			prodMu.Lock()
			defer prodMu.Unlock()
			return prodErr[i]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				batch := make([]outbox.Task, 0, len(queues))
				for _, q := range queues {
					batch = append(batch, outbox.Task{Queue: q, ID: fmt.Sprintf("t%05d", n),
						Delay: time.Duration(rand.IntN(1500)) * time.Millisecond})
				}
				if err := d.pg.insert(ctx, batch, len(batch)); err != nil {
					prodMu.Lock()
					prodErr[i] = err
					prodMu.Unlock()
					return
				}
				select {
				case <-stopLoad:
					return
				case <-time.After(120 * time.Millisecond):
				}
			}
		}()
	}

	// Worker SIGKILL: once every database has effects, its w1 dies in the
	// middle of its handlers and starts again.
	for _, d := range dbs {
		d.waitEffects(t, 24)
	}
	for _, d := range dbs {
		d.restart(t, "w1", cl.Addrs(), prefix, queues)
	}
	// Relay SIGKILL, once the workers have made progress since.
	for _, d := range dbs {
		d.waitEffects(t, d.effects(t)+24)
	}
	for _, d := range dbs {
		d.restart(t, "relay", cl.Addrs(), prefix, queues)
	}
	// Redis loss: the master with the most queues forgets everything, once every
	// new relay leads the healing of its database (it watches the marks).
	for _, d := range dbs {
		d.waitEffects(t, d.effects(t)+24)
		eventually(t, 60*time.Second, func() (bool, string) {
			return d.logged(t, "relay", "leading self-healing", true), d.key + ": the new relay does not lead self-healing"
		})
	}
	victim := ""
	for addr, qs := range perMaster {
		if victim == "" || len(qs) > len(perMaster[victim]) {
			victim = addr
		}
	}
	queued := 0
	for _, d := range dbs {
		queued += d.pg.count(t, `SELECT count(*) FROM delayq_outbox WHERE state = 'queued'`)
	}
	admin := redis.NewClient(&redis.Options{Addr: victim})
	t.Cleanup(func() { _ = admin.Close() })
	if err := admin.FlushAll(ctx).Err(); err != nil {
		t.Fatalf("FLUSHALL on %s: %v", victim, err)
	}

	// The load goes on until every database made progress after the loss.
	for _, d := range dbs {
		d.waitEffects(t, d.effects(t)+24)
	}
	close(stopLoad)
	wg.Wait()
	for i, err := range prodErr {
		if err != nil {
			t.Fatalf("%s: %v", dbs[i].key, err)
		}
	}
	totals := make([]int, len(dbs))
	for i, d := range dbs {
		totals[i] = d.pg.count(t, `SELECT count(*) FROM delayq_outbox`)
		eventually(t, 90*time.Second, func() (bool, string) {
			s := d.pg.states(t)
			return s["done"] == totals[i], fmt.Sprintf("%s: %v of %d", d.key, s, totals[i])
		})
	}
	for i, d := range dbs {
		t.Run(d.key, func(t *testing.T) {
			d.pg.checkEffects(t)
			if n := d.pg.count(t, `SELECT count(*) FROM effects`); n != totals[i] {
				t.Errorf("%d effects for %d tasks", n, totals[i])
			}
			if !d.logged(t, "relay", "Redis lost data", false) {
				t.Errorf("the relay of %s never detected the loss of %s", d.key, victim)
			}
		})
	}
	if queued == 0 {
		t.Errorf("no task was queued in Redis when %s was flushed: the fault never bit", victim)
	}
	t.Logf("3 databases, %v tasks, each run once: w1 and the relay of each killed, %s (%d queues) flushed with %d tasks queued",
		totals, victim, len(perMaster[victim]), queued)
}

// faultDB is one outbox database of TestSeveralDatabasesFaults and its
// processes.
type faultDB struct {
	key    string
	pg     pgBundle
	failed func() error // the producer's error, if it failed
	mu     sync.Mutex
	procs  map[string]*mdbProc // by role name: relay, w1, w2
	logs   []string            // every process's log file, killed ones included
}

// mdbProc is a child process.
type mdbProc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it exited and was waited for
}

// spawn starts a child process for role ("relay", or a worker's name) of the
// database, stopped (SIGTERM, then SIGKILL) when the test ends.
func (d *faultDB) spawn(t *testing.T, role string, addrs []string, prefix string, queues []string) {
	t.Helper()
	kind := "worker"
	if role == "relay" {
		kind = "relay"
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envMDBRole+"="+kind, envMDBPG+"="+d.pg.url,
		envMDBCluster+"="+strings.Join(addrs, ","), envMDBPrefix+"="+prefix,
		envMDBDatabase+"="+d.key, envMDBQueues+"="+strings.Join(queues, ","), envMDBName+"="+d.key+"-"+role)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	d.mu.Lock()
	path := filepath.Join(t.TempDir(), fmt.Sprintf("%s-%s-%d.log", d.key, role, len(d.logs)))
	d.logs = append(d.logs, path)
	d.mu.Unlock()
	logf, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	p := &mdbProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	d.mu.Lock()
	d.procs[role] = p
	d.mu.Unlock()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
}

// restart kills role's process with SIGKILL, waits until it is gone and starts
// a new one.
func (d *faultDB) restart(t *testing.T, role string, addrs []string, prefix string, queues []string) {
	t.Helper()
	d.mu.Lock()
	p := d.procs[role]
	d.mu.Unlock()
	select {
	case <-p.done:
		t.Fatalf("%s-%s exited before it was killed", d.key, role)
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	d.spawn(t, role, addrs, prefix, queues)
}

// effects counts the effects committed in the database.
func (d *faultDB) effects(t *testing.T) int {
	t.Helper()
	return d.pg.count(t, `SELECT count(*) FROM effects`)
}

// waitEffects waits until the database has n effects.
func (d *faultDB) waitEffects(t *testing.T, n int) {
	t.Helper()
	eventually(t, 60*time.Second, func() (bool, string) {
		if d.failed != nil {
			if err := d.failed(); err != nil {
				t.Fatalf("%s: the producer failed: %v", d.key, err)
			}
		}
		got := d.effects(t)
		return got >= n, fmt.Sprintf("%s: %d of %d effects; outbox %v", d.key, got, n, d.pg.states(t))
	})
}

// logged reports whether a log of role's processes (the killed ones too, unless
// last) contains s.
func (d *faultDB) logged(t *testing.T, role, s string, last bool) bool {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	logs := d.logs
	if last {
		logs = nil
		for _, path := range d.logs {
			if strings.Contains(filepath.Base(path), "-"+role+"-") {
				logs = []string{path}
			}
		}
	}
	for _, path := range logs {
		if !strings.Contains(filepath.Base(path), "-"+role+"-") {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), s) {
			return true
		}
	}
	return false
}

// multiDBChild runs a child process of TestSeveralDatabasesFaults until SIGTERM
// (or SIGKILL) and returns its exit code.
func multiDBChild(role string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	name := os.Getenv(envMDBName)
	// The relay logs at Info: the test waits for its "leading self-healing".
	level := slog.LevelWarn
	if role == "relay" {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("component", name)
	if err := runMultiDBChild(ctx, role, name, log); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}

func runMultiDBChild(ctx context.Context, role, name string, log *slog.Logger) error {
	pcfg, err := pgxpool.ParseConfig(os.Getenv(envMDBPG))
	if err != nil {
		return err
	}
	// Few connections: the test server's max_connections is shared with every
	// other test. A worker's 24 slots wait for one; the relay needs a few.
	pcfg.MaxConns = 8
	if role == "relay" {
		pcfg.MaxConns = 4
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	rdb := redis.NewClusterClient(testenv.ClusterOptions(strings.Split(os.Getenv(envMDBCluster), ",")))
	defer rdb.Close()
	prefix, database := os.Getenv(envMDBPrefix), os.Getenv(envMDBDatabase)
	switch role {
	case "relay":
		rl, err := relay.New(pool, rdb, relay.Config{Prefix: prefix, Database: database,
			BatchSize: 50, PollInterval: time.Second, RoundTimeout: 10 * time.Second,
			ReapInterval: 100 * time.Millisecond, Retention: -1, StatsInterval: -1,
			BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond, Logger: log,
			LossCheckInterval: 100 * time.Millisecond, LeaderRetry: 500 * time.Millisecond})
		if err != nil {
			return err
		}
		return rl.Run(ctx)
	case "worker":
		c, err := delayq.New(pool, rdb, delayq.Config{Prefix: prefix, Database: database, Logger: log,
			Worker: delayq.WorkerConfig{Lease: 1500 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond,
				ShutdownTimeout: 2 * time.Second, OpTimeout: 3 * time.Second, ErrorPause: 100 * time.Millisecond}})
		if err != nil {
			return err
		}
		for _, q := range strings.Split(os.Getenv(envMDBQueues), ",") {
			err := c.HandleTx(q, func(ctx context.Context, tx pgx.Tx, tk *delayq.Task) error {
				if err := effect(ctx, tx, name, tk); err != nil {
					return err
				}
				// Hold the effect uncommitted a little, so that a SIGKILL has a
				// window between the write and the commit.
				tm := time.NewTimer(time.Duration(rand.IntN(15)) * time.Millisecond)
				defer tm.Stop()
				select {
				case <-tm.C:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}, delayq.QueueConfig{Concurrency: 2, MaxAttempts: 1000,
				Backoff: delayq.Backoff{Base: 50 * time.Millisecond, Max: 200 * time.Millisecond}})
			if err != nil {
				return err
			}
		}
		return c.Run(ctx)
	}
	return fmt.Errorf("unknown role %q", role)
}

// dumpLogs writes the last lines of every process's log to the test log.
func (d *faultDB) dumpLogs(t *testing.T) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, path := range d.logs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Logf("%s: %v", path, err)
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		t.Logf("%s, last lines:\n%s", filepath.Base(path), strings.Join(lines[max(0, len(lines)-15):], "\n"))
	}
}

// ownPG is newPG on a PostgreSQL server of the test's own: the shared test
// server's connections are shared with every other test, and this test's nine
// processes hold many.
func ownPG(t *testing.T) pgBundle {
	t.Helper()
	url := testenv.OwnPostgres(t).URL()
	pool := testenv.Pool(t, url)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (
		queue text NOT NULL, task_id text NOT NULL, attempt int NOT NULL, worker text NOT NULL,
		due timestamptz NOT NULL, claimed_at timestamptz NOT NULL,
		at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return pgBundle{url: url, pool: pool, ob: ob}
}
