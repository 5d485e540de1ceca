package tempserver

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a Redis server this process owns, without persistence: a restart
// loses every key, as a cache node without AOF would.
type Redis struct {
	mu   sync.Mutex
	bin  string
	dir  string
	port int
	args []string
	proc *process
	url  string
	keep bool // dir is the caller's: Close leaves it
}

// RedisOptions tune a throwaway Redis server.
type RedisOptions struct {
	// Args are extra redis-server arguments, e.g. "--requirepass", "secret".
	Args []string
	// Dir keeps the server's files; Close leaves it. Default: a new temporary
	// directory, removed by Close.
	Dir string
	// AppendOnly keeps the data in an append-only file in Dir, so a server
	// started on Dir again has the keys it had. Default: no persistence.
	AppendOnly bool
	// Port is the port to listen on. Default: a free one.
	Port int
	// DirInContainer mounts Dir in a container of the Docker fallback too, so
	// that it keeps the data. Default: a container keeps its data inside itself,
	// removed with it (the files a container writes into a host directory
	// belong to its own user, whom the caller may not be able to remove).
	DirInContainer bool
}

// StartRedis starts a server from a local redis-server binary (no Docker
// fallback here: see StartPostgres).
func StartRedis(ctx context.Context, opts RedisOptions) (*Redis, error) {
	bin, err := RedisBinary("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%w: Redis: no local redis-server (%v); %s", ErrNoServer, err, InstallHint)
	}
	dir, err := runAs{}.mkdirFor(opts.Dir, "delayq-redis-")
	if err != nil {
		return nil, err
	}
	r := &Redis{bin: bin, dir: dir, port: opts.Port, args: opts.Args, keep: opts.Dir != ""}
	if r.port == 0 {
		if r.port, err = freePort(); err != nil {
			r.Close()
			return nil, err
		}
	}
	if opts.AppendOnly {
		r.args = append([]string{"--appendonly", "yes"}, r.args...)
	}
	if err := r.Start(ctx); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// URL is the server's redis:// URL.
func (r *Redis) URL() string {
	if r.url != "" {
		return r.url
	}
	return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port)
}

// Addr is host:port.
func (r *Redis) Addr() string {
	opt, _ := redis.ParseURL(r.URL())
	return opt.Addr
}

// Start starts a stopped server again on the same port, empty.
func (r *Redis) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		return nil
	}
	// Later arguments win: RedisOptions.AppendOnly's "--appendonly yes" overrides "no".
	args := append([]string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--daemonize", "no"}, r.args...)
	logPath := filepath.Join(r.dir, "redis.log")
	proc, err := startProcess(runAs{}.command(r.bin, args...), logPath)
	if err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	r.proc = proc
	err = waitReady(ctx, proc.exited, func() string { return tail(logPath) }, func(ctx context.Context) error {
		// A plain dial first: go-redis logs every refused dial.
		conn, err := net.DialTimeout("tcp", r.Addr(), time.Second)
		if err != nil {
			return err
		}
		conn.Close()
		opt, _ := redis.ParseURL(r.URL())
		c := redis.NewClient(opt)
		defer c.Close()
		info, err := c.Info(ctx, "server").Result()
		if err != nil && isAuthError(err) {
			return nil // up, and asking for a password we were not given here
		}
		if err != nil {
			return err
		}
		// The server on the port must be ours: another process may have taken
		// the port while this server was stopped, and ours then fails to bind.
		if want := "process_id:" + strconv.Itoa(proc.cmd.Process.Pid) + "\r\n"; !strings.Contains(info, want) {
			return fmt.Errorf("tempserver: port %d is answered by another Redis server", r.port)
		}
		return nil
	})
	if err != nil {
		proc.stop(syscall.SIGKILL, time.Second)
		r.proc = nil
		return err
	}
	return nil
}

func isAuthError(err error) bool {
	s := err.Error()
	return len(s) >= 7 && (s[:7] == "NOAUTH " || s[:7] == "WRONGPA")
}

// Stop shuts the server down (SIGTERM: it saves nothing, it has no persistence).
func (r *Redis) Stop() { r.halt(syscall.SIGTERM) }

// Kill ends the server at once.
func (r *Redis) Kill() { r.halt(syscall.SIGKILL) }

func (r *Redis) halt(sig syscall.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.proc.stop(sig, 10*time.Second)
	r.proc = nil
}

// Close stops the server and removes its directory, unless it is the
// RedisOptions.Dir it was given.
func (r *Redis) Close() {
	r.Stop()
	if r.dir != "" && !r.keep {
		_ = os.RemoveAll(r.dir)
	}
}
