// Package dockerserver starts throwaway PostgreSQL and Redis servers in Docker
// containers (dockertest): the fallback of `make test`, `make demo` and `make
// bench` on a machine without the server binaries, which internal/tempserver
// starts itself. It lives in the dev module so that the Docker client stays out
// of the root module's go.mod, and so out of every user's go.sum.
package dockerserver

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/ory/dockertest/v3"
	"github.com/redis/go-redis/v9"
)

// Docker images, pinned majors: the versions the project is tested on.
const (
	postgresImage, postgresTag = "postgres", "15"
	redisImage, redisTag       = "redis", "7"
)

// expireSeconds bounds a container's life: a crashed run leaves none for long.
const expireSeconds = 3600

// Server is a running container.
type Server struct {
	// URL is a connection URL: database "postgres" as superuser, or Redis db 0.
	URL  string
	pool *dockertest.Pool
	res  *dockertest.Resource
}

// Close removes the container.
func (s *Server) Close() error {
	if err := s.pool.Purge(s.res); err != nil {
		return fmt.Errorf("dockerserver: remove %s: %w", s.res.Container.Name, err)
	}
	return nil
}

// Available reports why Docker cannot run containers here (nil when it can).
func Available() error {
	_, err := dockerPool()
	return err
}

func dockerPool() (*dockertest.Pool, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, fmt.Errorf("dockerserver: %w", err)
	}
	if err := pool.Client.Ping(); err != nil {
		return nil, fmt.Errorf("dockerserver: docker is not reachable: %w", err)
	}
	return pool, nil
}

// PostgresOptions tune a PostgreSQL container.
type PostgresOptions struct {
	// MaxConnections is max_connections. Default 300.
	MaxConnections int
	// Durable keeps fsync on, as a production server has it (benchmarks). The
	// default turns it off: tests want speed, not durability.
	Durable bool
}

// Postgres starts a PostgreSQL container (trust authentication) and waits until
// it accepts connections.
func Postgres(ctx context.Context, opts PostgresOptions) (*Server, error) {
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 300
	}
	pool, err := dockerPool()
	if err != nil {
		return nil, err
	}
	cmd := []string{"postgres", "-c", fmt.Sprintf("max_connections=%d", opts.MaxConnections)}
	if !opts.Durable {
		cmd = append(cmd, "-c", "fsync=off", "-c", "full_page_writes=off")
	}
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: postgresImage, Tag: postgresTag,
		Env: []string{"POSTGRES_HOST_AUTH_METHOD=trust"},
		Cmd: cmd,
	})
	if err != nil {
		return nil, fmt.Errorf("dockerserver: start postgres: %w", err)
	}
	_ = res.Expire(expireSeconds)
	s := &Server{URL: fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", res.GetHostPort("5432/tcp")), pool: pool, res: res}
	err = pool.Retry(func() error {
		c, err := pgx.Connect(ctx, s.URL)
		if err != nil {
			return err
		}
		return c.Close(ctx)
	})
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("dockerserver: postgres not ready: %w", err)
	}
	return s, nil
}

// Redis starts a Redis container without persistence and waits until it answers.
func Redis(ctx context.Context) (*Server, error) {
	pool, err := dockerPool()
	if err != nil {
		return nil, err
	}
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: redisImage, Tag: redisTag,
		Cmd: []string{"redis-server", "--save", "", "--appendonly", "no"},
	})
	if err != nil {
		return nil, fmt.Errorf("dockerserver: start redis: %w", err)
	}
	_ = res.Expire(expireSeconds)
	s := &Server{URL: fmt.Sprintf("redis://%s/0", res.GetHostPort("6379/tcp")), pool: pool, res: res}
	opt, err := redis.ParseURL(s.URL)
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("dockerserver: %w", err)
	}
	err = pool.Retry(func() error {
		c := redis.NewClient(opt)
		defer c.Close()
		return c.Ping(ctx).Err()
	})
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("dockerserver: redis not ready: %w", err)
	}
	return s, nil
}
