// Package tempserver starts throwaway PostgreSQL and Redis servers for tests, the
// demo and the benchmarks from local server binaries, else it fails with one
// message that says what to install.
//
// FindPostgres and FindRedis fall back to Docker containers, through the
// docker command: a Go client of the Docker API would put itself and its
// dependencies in the root module's go.mod, and so in every user's go.sum (this
// package is linked by delayqtest and `delayq dev`). delayq's own make targets
// find servers through the dev module (internal/dev, cmd withservers, with
// dockertest) and pass their URLs (DELAYQ_TEST_*_URL, DATABASE_URL, REDIS_URL).
//
// Local servers run as child processes in a temporary directory on free loopback
// ports, keep nothing after Close (unless given a directory of their own), and,
// on Linux, die with the process that started them (Pdeathsig), so a crashed
// test leaves no server behind. The package builds on Unix systems only.
package tempserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoServer says that no local binary could provide a server.
var ErrNoServer = errors.New("tempserver: no way to start a server")

// InstallHint is the one message shown when no server can be started.
const InstallHint = InstallBinaries + ", " + DockerHint + ", " +
	"or pass the URLs of servers you already run"

// InstallBinaries says which packages provide the binaries this package looks
// for (on PATH, or where distributions put them: PostgresBinary, RedisBinary).
const InstallBinaries = "install PostgreSQL and Redis server binaries " +
	"(Debian/Ubuntu: apt-get install postgresql redis-server; macOS: brew install postgresql redis)"

// handedOut holds every port freePort gave in this process. A server that is
// stopped and started again (a fault test) takes its port back; meanwhile the
// kernel may hand that free port to another test's new server, whose restart
// target it would then silently be (a restarted Redis that failed to bind, and
// a readiness ping answered by the other server). A port is never given twice
// in one process; ports are a process-wide resource, hence the package variable.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// freePort asks the kernel for a free loopback port this process never handed
// out before.
func freePort() (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		handedOut.Lock()
		taken := handedOut.ports[port]
		handedOut.ports[port] = true
		handedOut.Unlock()
		if !taken {
			return port, nil
		}
	}
	return 0, errors.New("tempserver: no loopback port this process has not used")
}

// PostgresBinary finds a program of a PostgreSQL installation (initdb, pgbench):
// on PATH, else where distributions and Homebrew put it.
func PostgresBinary(name string) (string, error) {
	return lookPath(name, "/usr/lib/postgresql/*/bin", "/usr/local/pgsql/bin", "/opt/homebrew/opt/postgresql*/bin")
}

// RedisBinary finds a program of a Redis installation (redis-server,
// redis-benchmark): on PATH, else where Homebrew puts it.
func RedisBinary(name string) (string, error) {
	return lookPath(name, "/usr/local/opt/redis/bin", "/opt/homebrew/bin")
}

// lookPath finds a binary on PATH, else in the directories the globs match (newest
// version first).
func lookPath(name string, extraGlobs ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, g := range extraGlobs {
		matches, _ := filepath.Glob(g)
		// Versioned directories (postgresql/15, postgresql/16): prefer the newest.
		sort.Sort(sort.Reverse(sort.StringSlice(matches)))
		for _, m := range matches {
			p := filepath.Join(m, name)
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("%s not found on PATH", name)
}

// runAs describes the unprivileged user a server runs as when we are root
// (initdb and postgres refuse to run as root).
type runAs struct {
	uid, gid uint32
	set      bool
}

func unprivileged(name string) (runAs, error) {
	if os.Geteuid() != 0 {
		return runAs{}, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return runAs{}, fmt.Errorf("running as root and there is no %q user to run the server as: %w", name, err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return runAs{uid: uint32(uid), gid: uint32(gid), set: true}, nil
}

// command builds a child process that dies with us and runs as r.
func (r runAs) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = dieWithParent()
	if r.set {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: r.uid, Gid: r.gid}
	}
	return cmd
}

// mkdirFor makes a temporary directory the server's user owns, or, when dir is
// given, makes sure dir exists and that user owns it.
func (r runAs) mkdirFor(dir, pattern string) (string, error) {
	var err error
	if dir != "" {
		err = os.MkdirAll(dir, 0o700)
	} else {
		dir, err = os.MkdirTemp("", pattern)
	}
	if err != nil {
		return "", err
	}
	if r.set {
		if err := os.Chown(dir, int(r.uid), int(r.gid)); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}

// waitReady polls ready with a short, growing backoff until it succeeds, the
// process exits, or the deadline passes.
func waitReady(ctx context.Context, exited <-chan struct{}, logTail func() string, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	delay := 5 * time.Millisecond
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("server exited during start-up: %s", logTail())
		case <-ctx.Done():
			return fmt.Errorf("server not ready: %w (last error: %v) %s", ctx.Err(), err, logTail())
		case <-time.After(delay):
		}
		delay = min(delay*2, 200*time.Millisecond)
	}
}

// tail returns the last bytes of a log file, for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return "\n" + string(b)
}

// process is a running child server.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

func startProcess(cmd *exec.Cmd, logPath string) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	return p, nil
}

// processTree returns pid and its children, as /proc says now. A PostgreSQL
// postmaster's backends and background processes are its children, each in a
// session (and process group) of its own: a signal to the postmaster's group
// does not reach them.
func processTree(pid int) []int {
	pids := []int{pid}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return pids
	}
	parent := strconv.Itoa(pid)
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		if f := procStat(e.Name()); len(f) >= 2 && f[1] == parent {
			if child, err := strconv.Atoi(e.Name()); err == nil {
				pids = append(pids, child)
			}
		}
	}
	return pids
}

// procStat returns the fields of /proc/<pid>/stat after the command name: state,
// ppid, pgrp, … (nil when the process is gone). The name may hold spaces, so the
// fields are read after its closing ')'.
func procStat(pid string) []string {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// alive tells whether pid runs and is not a zombie (a zombie holds no memory).
func alive(pid int) bool {
	f := procStat(strconv.Itoa(pid))
	return len(f) >= 1 && f[0] != "Z"
}

// waitGone waits until none of pids is alive, at most timeout, and says which
// still run after it.
func waitGone(pids []int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		var left []int
		for _, pid := range pids {
			if alive(pid) {
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tempserver: processes %v still run %v after they were stopped", left, timeout)
		}
		time.Sleep(delay)
	}
}

// stop sends sig and waits up to grace for the exit, then kills.
func (p *process) stop(sig syscall.Signal, grace time.Duration) {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}
