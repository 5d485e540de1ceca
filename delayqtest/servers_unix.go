//go:build unix

package delayqtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/delayq/delayq/internal/tempserver"
)

// local are the servers New starts from local binaries when no URL is set: one
// PostgreSQL and one Redis for every test of the binary, started on first use.
// Servers are a process-wide resource (as the ports they take), hence a package
// variable; Main stops them.
var local struct {
	sync.Mutex
	dir      string // parent of both servers' directories, with the owner's pid
	pg       tempserver.Server
	redis    tempserver.Server
	pgErr    error
	redisErr error
}

// envServers says where New starts servers a URL does not name: "any" (the
// default: local binaries, else Docker), "local" or "docker". Unexported: a
// user sets it in a shell, not in Go (and the public surface has a budget).
const envServers = "DELAYQ_TEST_SERVERS"

// serverSource reads envServers.
func serverSource() (tempserver.Source, error) {
	from, err := tempserver.ParseSource(os.Getenv(envServers))
	if err != nil {
		return "", fmt.Errorf("%s: %w", envServers, err)
	}
	return from, nil
}

// pidFile, in a server directory of this package, holds the pid of the test
// process that owns it: a later process removes the directory once that one is
// gone (a test binary run without Main).
const pidFile = "owner.pid"

// localPostgres returns the URL of this binary's PostgreSQL, starting it on the
// first call.
func localPostgres(ctx context.Context) (string, error) {
	local.Lock()
	defer local.Unlock()
	if local.pg == nil && local.pgErr == nil {
		var from tempserver.Source
		if from, local.pgErr = serverSource(); local.pgErr == nil {
			if local.pgErr = makeLocalDir(); local.pgErr == nil {
				local.pg, local.pgErr = tempserver.FindPostgres(ctx, tempserver.PostgresOptions{
					Dir: filepath.Join(local.dir, "postgres"), MaxConnections: 500}, from)
			}
		}
	}
	if local.pgErr != nil {
		return "", local.pgErr
	}
	return local.pg.URL(), nil
}

// localRedis returns the URL of this binary's Redis, starting it on the first call.
func localRedis(ctx context.Context) (string, error) {
	local.Lock()
	defer local.Unlock()
	if local.redis == nil && local.redisErr == nil {
		var from tempserver.Source
		if from, local.redisErr = serverSource(); local.redisErr == nil {
			if local.redisErr = makeLocalDir(); local.redisErr == nil {
				local.redis, local.redisErr = tempserver.FindRedis(ctx, tempserver.RedisOptions{Dir: filepath.Join(local.dir, "redis")}, from)
			}
		}
	}
	if local.redisErr != nil {
		return "", local.redisErr
	}
	return local.redis.URL(), nil
}

// makeLocalDir makes the directory the servers keep their files in, once, after
// removing those of test processes that ended without Main.
func makeLocalDir() error {
	if local.dir != "" {
		return nil
	}
	removeOrphans()
	dir, err := os.MkdirTemp("", "delayqtest-")
	if err != nil {
		return err
	}
	// Readable by the postgres user the server runs as when the tests run as root.
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(dir)
		return err
	}
	local.dir = dir
	return nil
}

// removeOrphans removes the server directories of test processes that no longer
// run. On Linux their servers died with them (tempserver: Pdeathsig).
func removeOrphans() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "delayqtest-*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, pidFile))
		if err != nil {
			continue // being created, or not ours
		}
		pid, err := strconv.Atoi(string(b))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
}

// stopLocal stops the servers and removes their files.
func stopLocal() {
	local.Lock()
	defer local.Unlock()
	if local.pg != nil {
		local.pg.Close()
	}
	if local.redis != nil {
		local.redis.Close()
	}
	if local.dir != "" {
		_ = os.RemoveAll(local.dir)
	}
	local.pg, local.redis, local.dir = nil, nil, ""
}

// noServers is the one message New gives when it has neither a URL nor binaries.
func noServers(err error) string {
	if errors.Is(err, tempserver.ErrNoServer) {
		return fmt.Sprintf("delayqtest: no servers to test against: set %s and %s (or Options) to servers tests may use, "+
			"or %s, found on PATH or in /usr/lib/postgresql/*/bin, %s: %v", EnvPostgresURL, EnvRedisURL, tempserver.InstallBinaries, tempserver.DockerHint, err)
	}
	return fmt.Sprintf("delayqtest: start a local server: %v", err)
}

// startTimeout bounds a server's start (initdb takes a few seconds).
const startTimeout = 2 * time.Minute
