//go:build linux

package tempserver_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/tempserver"
	"github.com/delayq/delayq/internal/tempserver/fakedocker"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// TestMain lets this test binary be the docker command of fakedocker.
func TestMain(m *testing.M) {
	fakedocker.Main()
	os.Exit(m.Run())
}

// The Docker fallback starts each server in a container through the docker
// command, publishes it on 127.0.0.1, labels it with its owner, and removes it
// on Close.
func TestDockerFallback(t *testing.T) {
	state := fakedocker.Install(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	pg, err := tempserver.FindPostgres(ctx, tempserver.PostgresOptions{MaxConnections: 120}, tempserver.SourceDocker)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := tempserver.FindRedis(ctx, tempserver.RedisOptions{}, tempserver.SourceDocker)
	if err != nil {
		t.Fatal(err)
	}
	running := fakedocker.Running(state)
	if len(running) != 2 {
		t.Fatalf("containers running: %v, want two", running)
	}
	host, _ := os.Hostname()
	for _, id := range running {
		l := fakedocker.Labels(state, id)
		if l["io.delayq.tempserver.pid"] != strconv.Itoa(os.Getpid()) || l["io.delayq.tempserver.host"] != host {
			t.Errorf("container %s labels %v: want this process as owner", id, l)
		}
	}

	conn, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	var maxConns string
	if err := conn.QueryRow(ctx, "SHOW max_connections").Scan(&maxConns); err != nil || maxConns != "120" {
		t.Errorf("max_connections %q (%v), want the option's 120", maxConns, err)
	}
	conn.Close(ctx)
	opt, err := redis.ParseURL(rs.URL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	rdb.Close()

	pg.Close()
	rs.Close()
	if running := fakedocker.Running(state); len(running) != 0 {
		t.Errorf("containers running after Close: %v", running)
	}
}

// Local binaries come first; Docker only when they are missing or asked for.
func TestFindPrefersLocal(t *testing.T) {
	state := fakedocker.Install(t)
	ctx := context.Background()
	rs, err := tempserver.FindRedis(ctx, tempserver.RedisOptions{}, tempserver.SourceAny)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	if _, local := rs.(*tempserver.Redis); !local {
		t.Errorf("FindRedis started a %T, want the local *Redis", rs)
	}
	if running := fakedocker.Running(state); len(running) != 0 {
		t.Errorf("containers started: %v", running)
	}
}

// A container its owner left behind (a test binary killed by its timeout) is
// removed by the next start; one of a running process is left alone.
func TestDockerRemovesOrphans(t *testing.T) {
	state := fakedocker.Install(t)
	gone := fakedocker.AddOrphan(t, state, deadPID(t))
	kept := fakedocker.AddOrphan(t, state, os.Getppid())
	rs, err := tempserver.FindRedis(context.Background(), tempserver.RedisOptions{}, tempserver.SourceDocker)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	if fakedocker.Labels(state, gone) != nil {
		t.Error("the orphan of an ended process is still there")
	}
	if fakedocker.Labels(state, kept) == nil {
		t.Error("the container of a running process was removed")
	}
}

// Without a daemon, or without the command, the error says so and wraps
// ErrNoServer; with neither binaries nor Docker it names both ways out.
func TestDockerUnavailable(t *testing.T) {
	fakedocker.Install(t)
	t.Setenv(fakedocker.EnvDown, "1")
	_, err := tempserver.FindPostgres(context.Background(), tempserver.PostgresOptions{}, tempserver.SourceDocker)
	if !errors.Is(err, tempserver.ErrNoServer) || !strings.Contains(err.Error(), "no Docker daemon answers") {
		t.Errorf("daemon down: %v", err)
	}

	t.Setenv("PATH", t.TempDir())
	_, err = tempserver.FindRedis(context.Background(), tempserver.RedisOptions{}, tempserver.SourceDocker)
	if !errors.Is(err, tempserver.ErrNoServer) || !strings.Contains(err.Error(), "no docker command on PATH") {
		t.Errorf("no docker command: %v", err)
	}
}

func TestParseSource(t *testing.T) {
	for in, want := range map[string]tempserver.Source{"": tempserver.SourceAny, "any": tempserver.SourceAny,
		"local": tempserver.SourceLocal, " Docker ": tempserver.SourceDocker} {
		if got, err := tempserver.ParseSource(in); err != nil || got != want {
			t.Errorf("ParseSource(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := tempserver.ParseSource("podman"); !errors.Is(err, tempserver.ErrInvalidSource) {
		t.Errorf("ParseSource(podman): %v, want ErrInvalidSource", err)
	}
}

// deadPID returns the pid of a process that has ended.
func deadPID(t *testing.T) int {
	t.Helper()
	p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	return p.Pid
}
