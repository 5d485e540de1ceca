//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/delayq/delayq/internal/tempserver"
)

// devOptions are dev's flags.
type devOptions struct {
	dir                     string // keep the data here; "" throwaway
	postgresPort, redisPort int    // 0: a free port
	servers                 string // any, local or docker
}

func (o devOptions) validate() error {
	for name, port := range map[string]int{"--postgres-port": o.postgresPort, "--redis-port": o.redisPort} {
		if port < 0 || port > 65535 {
			return usagef("%s %d: must be 0 (a free port) to 65535", name, port)
		}
	}
	if o.postgresPort != 0 && o.postgresPort == o.redisPort {
		return usagef("--postgres-port and --redis-port are both %d", o.postgresPort)
	}
	if _, err := tempserver.ParseSource(o.servers); err != nil {
		return usagef("--servers %q: want any, local or docker", o.servers)
	}
	return nil
}

// runDev starts PostgreSQL and Redis from their local binaries, else in Docker
// containers (as the tests of package delayqtest do when no URL is set),
// prints the environment that points delayq and the tests at them, and runs
// until interrupted, then stops them. It links no Docker client: it runs the
// docker command.
func runDev(ctx context.Context, m *Main, args []string) error {
	fs := newFlagSet(m, "dev", "dev [flags]",
		"  delayq dev                       # throwaway servers on free ports; Ctrl-C stops them and removes their data\n"+
			"  delayq dev --dir .delayq-dev     # keep the data in .delayq-dev across runs\n"+
			"  delayq dev --dir .delayq-dev --postgres-port 5433 --redis-port 6380   # the same URLs every run\n"+
			"  delayq dev --servers docker      # in containers (postgres:15, redis:7) even where binaries are installed\n"+
			"  delayq dev > dev.env & while [ ! -s dev.env ]; do sleep 0.1; done; . dev.env   # in a script (the lines are written at once)\n")
	var o devOptions
	fs.StringVar(&o.dir, "dir", "", "keep the servers' data in this directory across runs (default: a temporary directory, removed at exit)")
	fs.IntVar(&o.postgresPort, "postgres-port", 0, "PostgreSQL's port on 127.0.0.1 (default: a free port)")
	fs.IntVar(&o.redisPort, "redis-port", 0, "Redis's port on 127.0.0.1 (default: a free port)")
	fs.StringVar(&o.servers, "servers", "any", "where to start the servers: any (local binaries, else Docker), local or docker")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if err := o.validate(); err != nil {
		return err
	}
	return o.run(ctx, m.Stdout, m.Stderr)
}

func (o devOptions) run(ctx context.Context, stdout, stderr io.Writer) error {
	from, _ := tempserver.ParseSource(o.servers) // validated
	pgOpts := tempserver.PostgresOptions{Port: o.postgresPort, DirInContainer: true}
	redisOpts := tempserver.RedisOptions{Port: o.redisPort, DirInContainer: true}
	if o.dir != "" {
		dir, err := filepath.Abs(o.dir)
		if err != nil {
			return err
		}
		pgOpts.Dir, redisOpts.Dir, redisOpts.AppendOnly = filepath.Join(dir, "postgres"), filepath.Join(dir, "redis"), true
	}
	pg, err := tempserver.FindPostgres(ctx, pgOpts, from)
	if err != nil {
		return devStartError("PostgreSQL", err)
	}
	defer pg.Close()
	rdb, err := tempserver.FindRedis(ctx, redisOpts, from)
	if err != nil {
		return devStartError("Redis", err)
	}
	defer rdb.Close()

	fmt.Fprint(stdout, devEnv(pg.URL(), rdb.URL()))
	kept := "throwaway: removed when they stop"
	if o.dir != "" {
		kept = "data kept in " + o.dir
	}
	fmt.Fprintf(stderr, "delayq dev: PostgreSQL %s (%s) and Redis %s (%s) are running (%s); export the lines above; Ctrl-C stops them\n",
		pg.URL(), serverKind(pg), rdb.URL(), serverKind(rdb), kept)
	<-ctx.Done()
	fmt.Fprintln(stderr, "delayq dev: stopping the servers")
	return nil
}

// The variables the tests of package delayqtest read (delayqtest.EnvPostgresURL
// and EnvRedisURL: the binary must not link delayqtest, which imports testing;
// TestDevEnvNames checks they agree).
const (
	testPostgresURLEnv = "DELAYQ_TEST_POSTGRES_URL"
	testRedisURLEnv    = "DELAYQ_TEST_REDIS_URL"
)

// devEnv is what dev prints: shell export lines for the CLI, an application and
// the tests of package delayqtest.
func devEnv(pgURL, redisURL string) string {
	var b strings.Builder
	for _, kv := range [][2]string{
		{"DATABASE_URL", pgURL}, {"REDIS_URL", redisURL},
		{testPostgresURLEnv, pgURL}, {testRedisURLEnv, redisURL},
	} {
		fmt.Fprintf(&b, "export %s='%s'\n", kv[0], kv[1])
	}
	return b.String()
}

// serverKind says where a server runs, for dev's line.
func serverKind(s tempserver.Server) string {
	if c, ok := s.(*tempserver.Container); ok {
		return "Docker container " + c.ID()
	}
	return "local binaries"
}

// devStartError keeps tempserver's one message when neither a binary nor
// Docker could serve (it names what to install).
func devStartError(what string, err error) error {
	if errors.Is(err, tempserver.ErrNoServer) {
		return err
	}
	return fmt.Errorf("start %s: %w", what, err)
}
