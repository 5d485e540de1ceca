//go:build unix

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayqtest"
	"github.com/delayq/delayq/internal/tempserver/fakedocker"
)

// dev prints the variables delayqtest reads.
func TestDevEnvNames(t *testing.T) {
	t.Parallel()
	if testPostgresURLEnv != delayqtest.EnvPostgresURL || testRedisURLEnv != delayqtest.EnvRedisURL {
		t.Errorf("dev prints %s and %s; delayqtest reads %s and %s",
			testPostgresURLEnv, testRedisURLEnv, delayqtest.EnvPostgresURL, delayqtest.EnvRedisURL)
	}
}

// The built binary's dev: the export lines name servers that answer; Ctrl-C
// stops them, exit 0; with --dir a second run finds the first one's data, and
// without it nothing is left.
func TestDevCommand(t *testing.T) {
	t.Parallel()
	bin := cliBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel) // after the parallel subtests
	// dev's temporary directory is the test's own: other test binaries running
	// at the same time start servers in the machine's. The server's user (root
	// runs it as postgres) must reach it.
	tmp, err := os.MkdirTemp("", "delayq-devtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}

	// dev starts the servers, checks them with check, then stops with SIGINT.
	dev := func(t *testing.T, check func(env map[string]string), extraEnv []string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, append([]string{"dev"}, args...)...)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + tmp}, extraEnv...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		env := map[string]string{}
		lines := bufio.NewScanner(out)
		for len(env) < 4 && lines.Scan() {
			k, v, ok := strings.Cut(strings.TrimPrefix(lines.Text(), "export "), "=")
			if !ok || !strings.HasPrefix(lines.Text(), "export ") {
				t.Fatalf("dev printed %q, want export lines", lines.Text())
			}
			env[k] = strings.Trim(v, "'")
		}
		if len(env) != 4 || env["DATABASE_URL"] != env[delayqtest.EnvPostgresURL] || env["REDIS_URL"] != env[delayqtest.EnvRedisURL] {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("dev printed %v; stderr: %s", env, stderr.String())
		}
		check(env)
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("dev after Ctrl-C: %v; stderr: %s", err, stderr.String())
		}
		if c, err := pgx.Connect(ctx, env["DATABASE_URL"]); err == nil {
			c.Close(ctx)
			t.Errorf("PostgreSQL still answers after dev stopped")
		}
		return stderr.String()
	}
	pgExec := func(env map[string]string, sql string) error {
		c, err := pgx.Connect(ctx, env["DATABASE_URL"])
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		_, err = c.Exec(ctx, sql)
		return err
	}
	redisClient := func(env map[string]string) *redis.Client {
		opt, err := redis.ParseURL(env["REDIS_URL"])
		if err != nil {
			t.Fatal(err)
		}
		return redis.NewClient(opt)
	}

	t.Run("throwaway", func(t *testing.T) {
		t.Parallel()
		before, _ := filepath.Glob(filepath.Join(tmp, "delayq-pg-*"))
		dev(t, func(env map[string]string) {
			if err := pgExec(env, `CREATE TABLE orders (id int)`); err != nil {
				t.Error(err)
			}
			rdb := redisClient(env)
			defer rdb.Close()
			if err := rdb.Ping(ctx).Err(); err != nil {
				t.Error(err)
			}
		}, nil)
		after, _ := filepath.Glob(filepath.Join(tmp, "delayq-pg-*"))
		if len(after) > len(before) {
			t.Errorf("data left behind: %v (before: %v)", after, before)
		}
	})

	t.Run("kept in --dir", func(t *testing.T) {
		t.Parallel()
		// Not t.TempDir (0700): run as root, the server runs as the postgres user,
		// who must reach the directory.
		dir, err := os.MkdirTemp("", "delayq-dev-test-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		dev(t, func(env map[string]string) {
			if err := pgExec(env, `CREATE TABLE orders (id int); INSERT INTO orders VALUES (7)`); err != nil {
				t.Error(err)
			}
			rdb := redisClient(env)
			defer rdb.Close()
			if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
				t.Error(err)
			}
		}, nil, "--dir", dir)
		dev(t, func(env map[string]string) {
			c, err := pgx.Connect(ctx, env["DATABASE_URL"])
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(ctx)
			var id int
			if err := c.QueryRow(ctx, `SELECT id FROM orders`).Scan(&id); err != nil || id != 7 {
				t.Errorf("the second run's orders: %d, %v", id, err)
			}
			rdb := redisClient(env)
			defer rdb.Close()
			if v, err := rdb.Get(ctx, "k").Result(); v != "v" {
				t.Errorf("the second run's Redis key: %q, %v", v, err)
			}
		}, nil, "--dir", dir)
	})

	// With --servers docker, the servers run in containers through the docker
	// command (fakedocker: local binaries behind a stand-in for the runtime),
	// removed when dev stops.
	t.Run("in Docker", func(t *testing.T) {
		t.Parallel()
		if testing.Short() {
			t.Skip("two more servers: make test runs it")
		}
		env, state := fakedocker.Setup(t)
		// The fake's servers keep their files in a TMPDIR of their own (the
		// environment's last TMPDIR wins): "throwaway" counts the files in tmp.
		own, err := os.MkdirTemp("", "delayq-devtest-docker-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(own) })
		if err := os.Chmod(own, 0o755); err != nil {
			t.Fatal(err)
		}
		env = append(env, "TMPDIR="+own)
		log := dev(t, func(map[string]string) {
			if running := fakedocker.Running(state); len(running) != 2 {
				t.Errorf("containers running: %v, want PostgreSQL's and Redis's", running)
			}
		}, env, "--servers", "docker")
		if strings.Count(log, "Docker container") != 2 {
			t.Errorf("dev's line does not say the servers run in Docker: %s", log)
		}
		if running := fakedocker.Running(state); len(running) != 0 {
			t.Errorf("containers running after dev stopped: %v", running)
		}
	})

	t.Run("usage", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{{"extra"}, {"--redis-port", "70000"}, {"--postgres-port", "6000", "--redis-port", "6000"}, {"--servers", "podman"}} {
			cmd := exec.CommandContext(ctx, bin, append([]string{"dev"}, args...)...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != exitUsage || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
				t.Errorf("dev %v: %v, %q; want exit 2 and one line", args, err, out)
			}
		}
	})
}
