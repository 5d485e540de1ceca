package tempserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// The Docker fallback runs the docker command, not a Go client of the Docker
// API: the client and its dependencies would land in every user's go.sum (this
// package is linked by delayqtest and by `delayq dev`). The images are those of
// internal/dev/dockerserver, the fallback of delayq's own make targets.
const (
	PostgresImage = "postgres:15"
	RedisImage    = "redis:7"
)

// Container labels: the owner's host and pid, so that a later start removes
// the containers of a process that ended without closing them (a test binary
// killed by its timeout). Containers have no Pdeathsig.
const (
	labelOwnerHost = "io.delayq.tempserver.host"
	labelOwnerPID  = "io.delayq.tempserver.pid"
)

// Server is a running server, from local binaries or in a container.
type Server interface {
	URL() string
	Close()
}

// Source says where FindPostgres and FindRedis start a server.
type Source string

const (
	// SourceAny tries local binaries, then Docker: the order of make demo's
	// finder.
	SourceAny Source = ""
	// SourceLocal uses local binaries only.
	SourceLocal Source = "local"
	// SourceDocker uses Docker only.
	SourceDocker Source = "docker"
)

// ErrInvalidSource is returned by ParseSource for a name it does not know.
var ErrInvalidSource = errors.New("tempserver: invalid server source")

// ParseSource reads a Source from a flag or an environment variable: "", "any",
// "local" or "docker".
func ParseSource(s string) (Source, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "any":
		return SourceAny, nil
	case "local":
		return SourceLocal, nil
	case "docker":
		return SourceDocker, nil
	}
	return "", fmt.Errorf("%w %q: want any, local or docker", ErrInvalidSource, s)
}

// DockerHint is the other way to get servers: Docker.
const DockerHint = "or Docker (the docker command with a running daemon: images " + PostgresImage + " and " + RedisImage + ")"

// FindPostgres starts PostgreSQL from local binaries, else (SourceAny) in a
// Docker container. opts.Durable is for local servers only.
func FindPostgres(ctx context.Context, opts PostgresOptions, from Source) (Server, error) {
	if from != SourceDocker {
		pg, err := StartPostgres(ctx, opts)
		if err == nil || from == SourceLocal || !errors.Is(err, ErrNoServer) {
			return nilIfErr(pg, err)
		}
	}
	c, err := startPostgresContainer(ctx, opts)
	return nilIfErr(c, noServer("PostgreSQL", from == SourceAny, err))
}

// FindRedis starts Redis from a local redis-server, else (SourceAny) in a
// Docker container.
func FindRedis(ctx context.Context, opts RedisOptions, from Source) (Server, error) {
	if from != SourceDocker {
		r, err := StartRedis(ctx, opts)
		if err == nil || from == SourceLocal || !errors.Is(err, ErrNoServer) {
			return nilIfErr(r, err)
		}
	}
	c, err := startRedisContainer(ctx, opts)
	return nilIfErr(c, noServer("Redis", from == SourceAny, err))
}

// nilIfErr keeps a nil pointer from becoming a non-nil Server.
func nilIfErr[S Server](s S, err error) (Server, error) {
	if err != nil {
		return nil, err
	}
	return s, nil
}

// noDocker is why Docker cannot start a container: no docker command, or no
// daemon answering it.
type noDocker string

func (e noDocker) Error() string { return string(e) }

// noServer turns a noDocker into the one message of ErrNoServer, naming the
// local binaries too when they were looked for first.
func noServer(what string, lookedLocal bool, err error) error {
	var nd noDocker
	if !errors.As(err, &nd) {
		return err
	}
	local := ""
	if lookedLocal {
		local = "no local binaries, and "
	}
	return fmt.Errorf("%w: %s: %s%s; %s", ErrNoServer, what, local, nd, InstallHint)
}

// Container is a server in a Docker container this process started.
type Container struct {
	docker string // the docker command
	id     string
	url    string
}

// URL is the server's URL on 127.0.0.1.
func (c *Container) URL() string { return c.url }

// ID is the container's id.
func (c *Container) ID() string { return c.id }

// Close removes the container (a Dir mounted in it keeps its data).
func (c *Container) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = exec.CommandContext(ctx, c.docker, "rm", "-f", "-v", c.id).Run()
}

// StartPostgresContainer starts PostgreSQL in a container, as superuser
// postgres with trust authentication, without fsync (as StartPostgres does for
// tests), on opts.Port of 127.0.0.1 or a free one. A Dir with DirInContainer
// keeps the data.
func StartPostgresContainer(ctx context.Context, opts PostgresOptions) (*Container, error) {
	c, err := startPostgresContainer(ctx, opts)
	return c, noServer("PostgreSQL", false, err)
}

func startPostgresContainer(ctx context.Context, opts PostgresOptions) (*Container, error) {
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 300
	}
	run := []string{"-e", "POSTGRES_HOST_AUTH_METHOD=trust"}
	if opts.Dir != "" && opts.DirInContainer {
		vol, err := volume(opts.Dir, "/var/lib/postgresql/data")
		if err != nil {
			return nil, err
		}
		run = append(run, vol...)
	}
	cmd := []string{"postgres", "-c", "max_connections=" + strconv.Itoa(opts.MaxConnections),
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "shared_buffers=128MB"}
	c, port, err := startContainer(ctx, "PostgreSQL", PostgresImage, 5432, opts.Port, run, cmd)
	if err != nil {
		return nil, err
	}
	c.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	// The image's entrypoint runs initdb and a first server on a socket only,
	// then the real one: ready is when the real one answers over TCP.
	err = c.waitReady(ctx, func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, c.url)
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	})
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// StartRedisContainer starts Redis in a container on opts.Port of 127.0.0.1 or
// a free one. A Dir with DirInContainer and AppendOnly keeps the data.
func StartRedisContainer(ctx context.Context, opts RedisOptions) (*Container, error) {
	c, err := startRedisContainer(ctx, opts)
	return c, noServer("Redis", false, err)
}

func startRedisContainer(ctx context.Context, opts RedisOptions) (*Container, error) {
	var run []string
	if opts.Dir != "" && opts.DirInContainer {
		vol, err := volume(opts.Dir, "/data")
		if err != nil {
			return nil, err
		}
		run = append(run, vol...)
	}
	cmd := append([]string{"redis-server", "--save", "", "--appendonly", "no"}, opts.Args...)
	if opts.AppendOnly {
		cmd = append(cmd, "--appendonly", "yes")
	}
	c, port, err := startContainer(ctx, "Redis", RedisImage, 6379, opts.Port, run, cmd)
	if err != nil {
		return nil, err
	}
	c.url = fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	err = c.waitReady(ctx, func(ctx context.Context) error {
		// A plain dial first: go-redis logs every refused dial.
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err != nil {
			return err
		}
		conn.Close()
		opt, _ := redis.ParseURL(c.url)
		rdb := redis.NewClient(opt)
		defer rdb.Close()
		if err := rdb.Ping(ctx).Err(); err != nil && !isAuthError(err) {
			return err
		}
		return nil
	})
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// volume is the -v argument mounting dir (made if absent) at path.
func volume(dir, path string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, err
	}
	return []string{"-v", abs + ":" + path}, nil
}

// dockerCommand returns the docker command once a daemon answers it.
func dockerCommand(ctx context.Context) (string, error) {
	docker, err := exec.LookPath("docker")
	if err != nil {
		return "", noDocker("no docker command on PATH")
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, docker, "version", "--format", "{{.Server.Version}}").CombinedOutput()
	if err != nil {
		return "", noDocker(fmt.Sprintf("no Docker daemon answers (docker version: %v: %s)", err, firstLine(out)))
	}
	return docker, nil
}

// startContainer runs image detached with the owner's labels, publishes
// containerPort on 127.0.0.1 (hostPort, or a free one) and returns the
// container with the host port.
func startContainer(ctx context.Context, what, image string, containerPort, hostPort int, run, cmd []string) (*Container, int, error) {
	docker, err := dockerCommand(ctx)
	if err != nil {
		return nil, 0, err
	}
	removeOrphanContainers(ctx, docker)
	host, _ := os.Hostname()
	publish := fmt.Sprintf("127.0.0.1::%d", containerPort)
	if hostPort != 0 {
		publish = fmt.Sprintf("127.0.0.1:%d:%d", hostPort, containerPort)
	}
	args := append([]string{"run", "-d", "--rm",
		"--label", labelOwnerHost + "=" + host, "--label", labelOwnerPID + "=" + strconv.Itoa(os.Getpid()),
		"-p", publish}, run...)
	args = append(append(args, image), cmd...)
	var stdout, stderr bytes.Buffer
	c := exec.CommandContext(ctx, docker, args...) // pulls the image the first time
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		return nil, 0, fmt.Errorf("start %s in Docker (docker run %s): %v: %s", what, image, err, lastLine(stderr.Bytes()))
	}
	ctr := &Container{docker: docker, id: strings.TrimSpace(stdout.String())}
	out, err := exec.CommandContext(ctx, docker, "port", ctr.id, fmt.Sprintf("%d/tcp", containerPort)).Output()
	if err != nil {
		ctr.Close()
		return nil, 0, fmt.Errorf("start %s in Docker: docker port: %v", what, err)
	}
	port, err := parsePublished(out)
	if err != nil {
		ctr.Close()
		return nil, 0, fmt.Errorf("start %s in Docker: %v", what, err)
	}
	return ctr, port, nil
}

// parsePublished reads the host port from docker port's output: one line per
// binding ("127.0.0.1:49153"), the first of them.
func parsePublished(out []byte) (int, error) {
	line := firstLine(out)
	i := strings.LastIndexByte(line, ':')
	port, err := strconv.Atoi(line[i+1:])
	if i < 0 || err != nil || port <= 0 || port > 65535 {
		return 0, fmt.Errorf("docker port printed %q, not an address", line)
	}
	return port, nil
}

// waitReady polls ready until it succeeds, the container stops, or a minute
// passes; a failure carries the container's last log lines.
func (c *Container) waitReady(ctx context.Context, ready func(context.Context) error) error {
	stopped := make(chan struct{})
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		// docker wait returns when the container exits (--rm removes it then).
		_ = exec.CommandContext(watchCtx, c.docker, "wait", c.id).Run()
		if watchCtx.Err() == nil {
			close(stopped)
		}
	}()
	logs := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		out, _ := exec.CommandContext(ctx, c.docker, "logs", "--tail", "20", c.id).CombinedOutput()
		return "\n" + string(out)
	}
	return waitReady(ctx, stopped, logs, ready)
}

// removeOrphanContainers removes the containers this package started from this
// host for processes that no longer run.
func removeOrphanContainers(ctx context.Context, docker string) {
	host, _ := os.Hostname()
	out, err := exec.CommandContext(ctx, docker, "ps", "-a", "--filter", "label="+labelOwnerHost+"="+host,
		"--format", `{{.ID}} {{.Label "`+labelOwnerPID+`"}}`).Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		id, pid, ok := strings.Cut(line, " ")
		// Kill with signal 0 tests for the process (alive reads /proc, Linux only).
		if n, err := strconv.Atoi(pid); ok && err == nil && n > 0 && errors.Is(syscall.Kill(n, 0), syscall.ESRCH) {
			_ = exec.CommandContext(ctx, docker, "rm", "-f", "-v", id).Run()
		}
	}
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

func lastLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	return s[strings.LastIndexByte(s, '\n')+1:]
}
