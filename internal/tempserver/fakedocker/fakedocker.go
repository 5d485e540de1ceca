// Package fakedocker stands in for the docker command in tests of the Docker
// fallback (tempserver.FindPostgres, FindRedis) on machines without a Docker
// daemon, as CI's. The test binary, run under the name docker, understands the
// commands the fallback runs (version, run, port, wait, logs, ps, rm) and
// starts each "container" from local binaries through tempserver: the servers
// behind it are real PostgreSQL and Redis, only the container runtime is not.
//
// A test package calls Main first in its TestMain, and a test calls Install.
package fakedocker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/tempserver"
)

const (
	// EnvState names the directory holding the fake daemon's containers.
	EnvState = "DELAYQ_FAKE_DOCKER_STATE"
	// EnvDown makes the fake answer as a docker command whose daemon is down.
	EnvDown = "DELAYQ_FAKE_DOCKER_DOWN"
	// serveArg is the hidden command a container's process runs.
	serveArg = "__serve"
)

// Install puts a docker command first on PATH for the rest of the test (it is
// this test binary) and returns the directory of its state. The containers
// still running when the test ends are stopped.
func Install(t testing.TB) string {
	t.Helper()
	env, state := Setup(t)
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	return state
}

// Setup is Install for a command the test starts itself (and for parallel
// tests, which cannot set the environment): it returns the PATH and state
// variables for the command's environment.
func Setup(t testing.TB) (env []string, state string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin, state := t.TempDir(), t.TempDir()
	if err := os.Symlink(exe, filepath.Join(bin, "docker")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ids, _ := containerIDs(state)
		remove(state, ids)
	})
	return []string{"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH"), EnvState + "=" + state,
		// A race-detector binary sleeps 1 s at exit, for reports from goroutines
		// still running: the fake's commands have none.
		"GORACE=atexit_sleep_ms=0 " + os.Getenv("GORACE")}, state
}

// Running returns the ids of the containers that run now.
func Running(state string) []string {
	ids, _ := containerIDs(state)
	var running []string
	for _, id := range ids {
		if c, err := load(state, id); err == nil && c.alive() {
			running = append(running, id)
		}
	}
	return running
}

// Labels returns a container's labels.
func Labels(state, id string) map[string]string {
	c, err := load(state, id)
	if err != nil {
		return nil
	}
	return c.Labels
}

// AddOrphan records a container, not running, labelled as started by pid on
// this host: what a killed test process leaves.
func AddOrphan(t testing.TB, state string, pid int) string {
	t.Helper()
	host, _ := os.Hostname()
	c := container{ID: newID(), Labels: map[string]string{
		"io.delayq.tempserver.host": host, "io.delayq.tempserver.pid": strconv.Itoa(pid)}}
	if err := c.save(state); err != nil {
		t.Fatal(err)
	}
	return c.ID
}

// Main runs the fake and exits when the binary was started as docker; else it
// returns at once.
func Main() {
	if filepath.Base(os.Args[0]) != "docker" {
		return
	}
	state := os.Getenv(EnvState)
	if state == "" {
		fmt.Fprintln(os.Stderr, "fakedocker: "+EnvState+" is not set")
		os.Exit(125)
	}
	os.Exit(run(state, os.Args[1:]))
}

// container is the fake daemon's record of a container, in state/<id>.json.
type container struct {
	ID       string            `json:"id"`
	Image    string            `json:"image"`
	Labels   map[string]string `json:"labels"`
	HostPort int               `json:"host_port"`
	Port     int               `json:"port"` // the container's
	Volume   string            `json:"volume"`
	Cmd      []string          `json:"cmd"`
	PID      int               `json:"pid"`
}

func (c container) save(state string) error {
	b, _ := json.Marshal(c)
	tmp := filepath.Join(state, c.ID+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(state, c.ID+".json"))
}

func load(state, id string) (container, error) {
	var c container
	b, err := os.ReadFile(filepath.Join(state, id+".json"))
	if err != nil {
		return c, fmt.Errorf("fakedocker: no such container: %s", id)
	}
	return c, json.Unmarshal(b, &c)
}

func (c container) alive() bool {
	if c.PID <= 0 || errors.Is(syscall.Kill(c.PID, 0), syscall.ESRCH) {
		return false
	}
	// An exited process nobody has reaped yet is no container running.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.PID))
	if i := strings.LastIndexByte(string(b), ')'); err == nil && i > 0 && i+2 < len(b) {
		return b[i+2] != 'Z'
	}
	return true
}

func containerIDs(state string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(state, "*.json"))
	ids := make([]string, 0, len(files))
	for _, f := range files {
		ids = append(ids, strings.TrimSuffix(filepath.Base(f), ".json"))
	}
	return ids, err
}

func newID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func run(state string, args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "fakedocker: no command")
		return 125
	}
	if args[0] != serveArg && os.Getenv(EnvDown) != "" {
		fmt.Fprintln(os.Stderr, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?")
		return 1
	}
	var err error
	switch args[0] {
	case "version":
		fmt.Println("28.0.0-fake")
	case "run":
		err = runContainer(state, args[1:])
	case serveArg:
		err = serve(state, args[1])
	case "port":
		var c container
		if c, err = load(state, args[1]); err == nil {
			fmt.Printf("127.0.0.1:%d\n[::1]:%d\n", c.HostPort, c.HostPort)
		}
	case "wait":
		var c container
		if c, err = load(state, args[1]); err == nil {
			for c.alive() {
				time.Sleep(20 * time.Millisecond)
			}
			fmt.Println(0)
		}
	case "logs":
		b, _ := os.ReadFile(filepath.Join(state, args[len(args)-1]+".log"))
		os.Stdout.Write(b)
	case "ps":
		err = ps(state, args[1:])
	case "rm":
		var ids []string
		for _, a := range args[1:] {
			if !strings.HasPrefix(a, "-") {
				ids = append(ids, a)
			}
		}
		remove(state, ids)
	default:
		err = fmt.Errorf("fakedocker: unknown command %q", args[0])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// runContainer reads docker run's arguments, records the container and starts
// its process, detached (its own session: it outlives this command, as a
// container outlives docker run).
func runContainer(state string, args []string) error {
	c := container{ID: newID(), Labels: map[string]string{}}
	i := 0
	for ; i < len(args) && strings.HasPrefix(args[i], "-"); i++ {
		switch args[i] {
		case "-d", "--rm":
		case "--label":
			i++
			k, v, _ := strings.Cut(args[i], "=")
			c.Labels[k] = v
		case "-e":
			i++
		case "-v":
			i++
			c.Volume, _, _ = strings.Cut(args[i], ":")
		case "-p": // 127.0.0.1:HOST:CONTAINER, HOST empty for a free one
			i++
			parts := strings.Split(args[i], ":")
			if len(parts) != 3 {
				return fmt.Errorf("fakedocker: -p %q: want ip:host:container", args[i])
			}
			c.Port, _ = strconv.Atoi(parts[2])
			if parts[1] != "" {
				c.HostPort, _ = strconv.Atoi(parts[1])
			} else {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					return err
				}
				c.HostPort = l.Addr().(*net.TCPAddr).Port
				l.Close()
			}
		default:
			return fmt.Errorf("fakedocker: run: unknown flag %q", args[i])
		}
	}
	if i == len(args) {
		return errors.New("fakedocker: run: no image")
	}
	c.Image, c.Cmd = args[i], args[i+1:]
	log, err := os.Create(filepath.Join(state, c.ID+".log"))
	if err != nil {
		return err
	}
	defer log.Close()
	exe, _ := os.Executable()
	cmd := exec.Command(exe, serveArg, c.ID)
	cmd.Args[0] = "docker" // Main's test for the fake
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := c.save(state); err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	c.PID = cmd.Process.Pid
	if err := c.save(state); err != nil {
		return err
	}
	fmt.Println(c.ID)
	return cmd.Process.Release()
}

// serve is a container's process: it runs the image's server from local
// binaries until it is signalled, then stops it and removes the container.
func serve(state, id string) error {
	c, err := load(state, id)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var srv tempserver.Server
	switch {
	case strings.HasPrefix(c.Image, "postgres:"):
		opts := tempserver.PostgresOptions{Port: c.HostPort, Dir: c.Volume}
		for j, a := range c.Cmd {
			if v, ok := strings.CutPrefix(a, "max_connections="); ok && j > 0 && c.Cmd[j-1] == "-c" {
				opts.MaxConnections, _ = strconv.Atoi(v)
			}
		}
		srv, err = tempserver.StartPostgres(ctx, opts)
	case strings.HasPrefix(c.Image, "redis:"):
		opts := tempserver.RedisOptions{Port: c.HostPort, Dir: c.Volume}
		for j, a := range c.Cmd {
			if a == "--appendonly" && j+1 < len(c.Cmd) {
				opts.AppendOnly = c.Cmd[j+1] == "yes"
			}
		}
		srv, err = tempserver.StartRedis(ctx, opts)
	default:
		err = fmt.Errorf("fakedocker: no server for image %q", c.Image)
	}
	if err != nil {
		os.Remove(filepath.Join(state, id+".json"))
		return err
	}
	fmt.Println("ready to accept connections")
	<-ctx.Done()
	srv.Close()
	return os.Remove(filepath.Join(state, id+".json"))
}

// ps prints the containers matching a --filter label=K=V, in the one format
// the fallback asks for: the id and the value of a label.
func ps(state string, args []string) error {
	var key, value, format string
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--filter":
			key, value, _ = strings.Cut(strings.TrimPrefix(args[i+1], "label="), "=")
		case "--format":
			format = args[i+1]
		}
	}
	_, rest, ok := strings.Cut(format, `{{.Label "`)
	label, _, _ := strings.Cut(rest, `"`)
	if !ok {
		return fmt.Errorf("fakedocker: ps: format %q not understood", format)
	}
	ids, err := containerIDs(state)
	for _, id := range ids {
		c, err := load(state, id)
		if err == nil && c.Labels[key] == value {
			fmt.Println(id, c.Labels[label])
		}
	}
	return err
}

// remove stops the containers' processes and forgets them.
func remove(state string, ids []string) {
	for _, id := range ids {
		c, err := load(state, id)
		if err != nil {
			continue
		}
		if c.alive() {
			_ = syscall.Kill(c.PID, syscall.SIGTERM)
			for deadline := time.Now().Add(30 * time.Second); c.alive() && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
			}
		}
		os.Remove(filepath.Join(state, id+".json"))
		os.Remove(filepath.Join(state, id+".log"))
	}
}
