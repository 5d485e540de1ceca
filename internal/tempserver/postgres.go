package tempserver

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresOptions tune a throwaway PostgreSQL server.
type PostgresOptions struct {
	// Durable keeps fsync and synchronous_commit on, as a production server has
	// them (benchmarks). The default turns them off: tests want speed, not durability.
	Durable bool
	// MaxConnections is max_connections. Default 300.
	MaxConnections int
	// Dir keeps the server's data (Dir/data), log and socket: a server started
	// on a Dir that holds data starts on it (initdb runs only on an empty one),
	// and Close leaves it. Default: a new temporary directory, removed by Close.
	Dir string
	// Port is the port to listen on. Default: a free one.
	Port int
	// DirInContainer mounts Dir in a container of the Docker fallback too, so
	// that it keeps the data. Default: a container keeps its data inside itself,
	// removed with it (the files a container writes into a host directory
	// belong to its own user, whom the caller may not be able to remove).
	DirInContainer bool
}

// Postgres is a PostgreSQL server this process owns. It can be stopped, killed
// and started again on the same port with the same data.
type Postgres struct {
	mu   sync.Mutex
	bin  string // directory of initdb and postgres
	dir  string // data and socket directory, removed by Close
	port int
	opts PostgresOptions
	as   runAs
	proc *process
	// leftover are processes of the last server that had not exited when it was
	// stopped: Start waits for them.
	leftover []int
	url      string
}

// StartPostgres starts a server from local binaries. There is no Docker fallback
// in this module (it would put the Docker client in users' go.sum): `make test`
// and `make demo` start containers through internal/dev when no binaries are
// installed and pass their URLs.
func StartPostgres(ctx context.Context, opts PostgresOptions) (*Postgres, error) {
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 300
	}
	initdb, err := PostgresBinary("initdb")
	if err == nil {
		return startLocalPostgres(ctx, filepath.Dir(initdb), opts)
	}
	return nil, fmt.Errorf("%w: PostgreSQL: no local initdb (%v); %s", ErrNoServer, err, InstallHint)
}

func startLocalPostgres(ctx context.Context, bin string, opts PostgresOptions) (*Postgres, error) {
	as, err := unprivileged("postgres")
	if err != nil {
		return nil, err
	}
	dir, err := as.mkdirFor(opts.Dir, "delayq-pg-")
	if err != nil {
		return nil, err
	}
	pg := &Postgres{bin: bin, dir: dir, opts: opts, as: as, port: opts.Port}
	removeDir := func() {
		if opts.Dir == "" {
			os.RemoveAll(dir)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "PG_VERSION")); err != nil {
		if err := as.initData(bin, filepath.Join(dir, "data")); err != nil {
			removeDir()
			return nil, err
		}
	}
	if pg.port == 0 {
		if pg.port, err = freePort(); err != nil {
			removeDir()
			return nil, err
		}
	}
	if err := pg.Start(ctx); err != nil {
		pg.Close()
		return nil, err
	}
	return pg, nil
}

// initData puts a new cluster's data directory at data. initdb takes seconds on
// a loaded machine and every test binary starts a server, so its output is kept
// once per machine (per initdb binary and user) in the temporary directory and
// copied, a fraction of that; where the copy fails, initdb runs.
func (r runAs) initData(bin, data string) error {
	initdb := filepath.Join(bin, "initdb")
	fi, err := os.Stat(initdb)
	if err != nil {
		return err
	}
	uid := os.Geteuid()
	if r.set {
		uid = int(r.uid)
	}
	cache := filepath.Join(os.TempDir(), fmt.Sprintf("delayq-initdb-%d-%d-%d", uid, fi.Size(), fi.ModTime().UnixNano()))
	if _, err := os.Stat(filepath.Join(cache, "PG_VERSION")); err != nil {
		tmp, err := r.mkdirFor("", "delayq-initdb-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		if err := r.initdb(initdb, filepath.Join(tmp, "data")); err != nil {
			return err
		}
		// Atomic: a copy never sees half a cluster; a concurrent binary that
		// renamed first wins, and this one's output is removed.
		_ = os.Rename(filepath.Join(tmp, "data"), cache)
	}
	if out, err := r.command("cp", "-a", cache, data).CombinedOutput(); err != nil {
		_ = os.RemoveAll(data)
		if err := r.initdb(initdb, data); err != nil {
			return fmt.Errorf("%w (after copying %s failed: %s)", err, cache, out)
		}
	}
	return nil
}

func (r runAs) initdb(initdb, data string) error {
	cmd := r.command(initdb, "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, out)
	}
	return nil
}

// URL is a connection URL for database "postgres" as superuser.
func (p *Postgres) URL() string {
	if p.url != "" {
		return p.url
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
}

// Start starts a stopped server again on the same port and data.
func (p *Postgres) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc != nil {
		return nil
	}
	if err := waitGone(p.leftover, 30*time.Second); err != nil {
		return fmt.Errorf("start postgres: the old server's %w", err)
	}
	p.leftover = nil
	// fsync=off survives a killed server (the OS keeps the writes), not a lost
	// machine: right for tests. synchronous_commit stays on so that a commit that
	// returned is never lost when a fault test kills the server.
	fsync := "off"
	if p.opts.Durable {
		fsync = "on"
	}
	args := []string{"-D", filepath.Join(p.dir, "data"), "-p", strconv.Itoa(p.port),
		"-k", p.dir, "-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=" + fsync, "-c", "full_page_writes=" + fsync,
		"-c", "max_connections=" + strconv.Itoa(p.opts.MaxConnections),
		"-c", "shared_buffers=128MB", "-c", "log_min_messages=warning"}
	logPath := filepath.Join(p.dir, "postgres.log")
	proc, err := startProcess(p.as.command(filepath.Join(p.bin, "postgres"), args...), logPath)
	if err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	p.proc = proc
	err = waitReady(ctx, proc.exited, func() string { return tail(logPath) }, func(ctx context.Context) error {
		c, err := pgx.Connect(ctx, p.URL())
		if err != nil {
			return err
		}
		return c.Close(ctx)
	})
	if err != nil {
		proc.stop(syscall.SIGKILL, time.Second)
		p.proc = nil
		return err
	}
	return nil
}

// Stop shuts the server down cleanly (fast shutdown: open sessions are ended). It
// returns once every process of the server has exited.
func (p *Postgres) Stop() {
	p.halt(syscall.SIGINT)
}

// Kill ends the server at once, as a crash would: the postmaster and every backend
// and background process. It returns once none of them runs any more, so that a
// Start right after does not find the old shared memory still attached ("pre-existing
// shared memory block is still in use").
func (p *Postgres) Kill() {
	p.halt(syscall.SIGKILL)
}

// halt stops the server with sig and waits until all its processes are gone. The
// postmaster is frozen first (SIGSTOP), so that it forks no process after the list
// of its children is read; under SIGKILL the children are killed too, since a
// backend notices its postmaster's death only at its next check.
func (p *Postgres) halt(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc == nil {
		return
	}
	pid := p.proc.cmd.Process.Pid
	if sig == syscall.SIGKILL {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	procs := processTree(pid)
	if sig == syscall.SIGKILL {
		for _, child := range procs[1:] {
			_ = syscall.Kill(child, syscall.SIGKILL)
		}
	}
	p.proc.stop(sig, 10*time.Second)
	p.proc = nil
	p.leftover = procs
	if waitGone(procs, 30*time.Second) == nil {
		p.leftover = nil
	}
}

// Close stops the server and removes its data, unless they are in the
// PostgresOptions.Dir it was given.
func (p *Postgres) Close() {
	p.Stop()
	if p.dir != "" && p.opts.Dir == "" {
		_ = os.RemoveAll(p.dir)
	}
}

// CreateDatabase creates an empty database and returns its URL.
func CreateDatabase(ctx context.Context, serverURL, name, template string) (string, error) {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		sql += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	// Concurrent clones of one template may collide on its lock: retry briefly.
	for attempt := 0; ; attempt++ {
		_, err = conn.Exec(ctx, sql)
		if err == nil || attempt == 50 || !isRetryableCreate(err) {
			break
		}
		time.Sleep(time.Duration(10+attempt*5) * time.Millisecond)
	}
	if err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return replaceDatabase(serverURL, name), nil
}

// DropDatabase drops a database, ending its sessions.
func DropDatabase(ctx context.Context, serverURL, name string) error {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}

func isRetryableCreate(err error) bool {
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		// 55006 object_in_use: the template is being accessed by other users.
		return pgErr.SQLState() == "55006"
	}
	return false
}

// replaceDatabase returns serverURL with its database name changed.
func replaceDatabase(serverURL, name string) string {
	if u, err := url.Parse(serverURL); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		return u.String()
	}
	// Keyword/value form: "host=... dbname=x".
	fields := strings.Fields(serverURL)
	out := fields[:0]
	for _, f := range fields {
		if !strings.HasPrefix(f, "dbname=") {
			out = append(out, f)
		}
	}
	return strings.Join(append(out, "dbname="+name), " ")
}
