// Command withservers runs a command with PostgreSQL and Redis available: where
// a server's URL is not given and no local binary can start one (the tests and
// the demo start their own from the binaries, internal/tempserver), it starts a
// Docker container and passes its URL in the environment. The containers are
// removed when the command exits; its exit code is withservers'.
//
//	go run ./internal/dev/withservers --env test -- go test ./...   # DELAYQ_TEST_POSTGRES_URL, DELAYQ_TEST_REDIS_URL
//	go run ./internal/dev/withservers --env app -- delayq demo      # DATABASE_URL, REDIS_URL
//
// The Makefile calls it (through .ci/withservers, which skips it where nothing is
// missing) so that `make test`, `make demo` and `make bench` need no servers
// installed where Docker runs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/delayq/delayq/internal/dev/dockerserver"
	"github.com/delayq/delayq/internal/tempserver"
)

// envNames are the variables that carry the servers' URLs to the command.
type envNames struct{ postgres, redis string }

var envSets = map[string]envNames{
	"test": {"DELAYQ_TEST_POSTGRES_URL", "DELAYQ_TEST_REDIS_URL"},
	"app":  {"DATABASE_URL", "REDIS_URL"},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("withservers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	set := fs.String("env", "test", "which variables carry the URLs: test (DELAYQ_TEST_POSTGRES_URL, DELAYQ_TEST_REDIS_URL) or app (DATABASE_URL, REDIS_URL)")
	var pgOpts dockerserver.PostgresOptions
	fs.IntVar(&pgOpts.MaxConnections, "max-connections", 300, "max_connections of a PostgreSQL container")
	fs.BoolVar(&pgOpts.Durable, "durable", false, "keep fsync on in a PostgreSQL container (benchmarks)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: withservers [flags] -- command [args...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	names, ok := envSets[*set]
	if !ok || fs.NArg() == 0 {
		fs.Usage()
		return 2
	}

	// A Ctrl-C reaches the command too (same process group): withservers outlives
	// it to remove the containers. (Notify, not Ignore: an ignored signal would
	// stay ignored in the command.)
	signal.Notify(make(chan os.Signal, 1), syscall.SIGINT, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	env, closers, err := startMissing(ctx, names, pgOpts, stderr)
	cancel()
	defer func() {
		for _, c := range closers {
			if err := c(); err != nil {
				fmt.Fprintln(stderr, "withservers:", err)
			}
		}
	}()
	if err != nil {
		fmt.Fprintln(stderr, "withservers:", err)
		return 1
	}

	cmd := exec.Command(fs.Arg(0), fs.Args()[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, stderr
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Run(); err != nil {
		if ee, ok := errors.AsType[*exec.ExitError](err); ok && ee.ExitCode() > 0 {
			return ee.ExitCode()
		}
		fmt.Fprintln(stderr, "withservers:", err)
		return 1
	}
	return 0
}

// startMissing starts a container for each server that has neither a URL in
// the environment nor a local binary, and returns the variables that name them.
func startMissing(ctx context.Context, names envNames, pgOpts dockerserver.PostgresOptions, stderr io.Writer) (env []string, closers []func() error, err error) {
	needPG := os.Getenv(names.postgres) == ""
	if _, err := tempserver.PostgresBinary("initdb"); err == nil {
		needPG = false
	}
	needRedis := os.Getenv(names.redis) == ""
	if _, err := tempserver.RedisBinary("redis-server"); err == nil {
		needRedis = false
	}
	if !needPG && !needRedis {
		return nil, nil, nil
	}
	if err := dockerserver.Available(); err != nil {
		return nil, nil, fmt.Errorf("no local server binaries and %w; %s", err, tempserver.InstallHint)
	}
	if needPG {
		fmt.Fprintln(stderr, "withservers: no local PostgreSQL: starting a container…")
		pg, err := dockerserver.Postgres(ctx, pgOpts)
		if err != nil {
			return env, closers, err
		}
		closers = append(closers, pg.Close)
		env = append(env, names.postgres+"="+pg.URL)
	}
	if needRedis {
		fmt.Fprintln(stderr, "withservers: no local Redis: starting a container…")
		r, err := dockerserver.Redis(ctx)
		if err != nil {
			return env, closers, err
		}
		closers = append(closers, r.Close)
		env = append(env, names.redis+"="+r.URL)
	}
	return env, closers, nil
}
