package tempserver

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/ory/dockertest/v3"
	"github.com/redis/go-redis/v9"
)

// Docker images used when no local binaries exist. Pinned majors: the versions
// the project is tested on.
const (
	postgresImage, postgresTag = "postgres", "15"
	redisImage, redisTag       = "redis", "7"
)

func dockerPool() (*dockertest.Pool, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, err
	}
	if err := pool.Client.Ping(); err != nil {
		return nil, fmt.Errorf("docker is not reachable: %w", err)
	}
	return pool, nil
}

func startDockerPostgres(ctx context.Context, opts PostgresOptions) (*Postgres, error) {
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
		return nil, err
	}
	_ = res.Expire(3600) // a crashed test leaves no container for long
	u := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", res.GetHostPort("5432/tcp"))
	err = pool.Retry(func() error {
		c, err := pgx.Connect(ctx, u)
		if err != nil {
			return err
		}
		return c.Close(ctx)
	})
	if err != nil {
		_ = pool.Purge(res)
		return nil, err
	}
	return &Postgres{url: u, dockerC: func() { _ = pool.Purge(res) }}, nil
}

func startDockerRedis(ctx context.Context, opts RedisOptions) (*Redis, error) {
	pool, err := dockerPool()
	if err != nil {
		return nil, err
	}
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: redisImage, Tag: redisTag,
		Cmd: append([]string{"redis-server", "--save", "", "--appendonly", "no"}, opts.Args...),
	})
	if err != nil {
		return nil, err
	}
	_ = res.Expire(3600)
	u := fmt.Sprintf("redis://%s/0", res.GetHostPort("6379/tcp"))
	err = pool.Retry(func() error {
		opt, _ := redis.ParseURL(u)
		c := redis.NewClient(opt)
		defer c.Close()
		return c.Ping(ctx).Err()
	})
	if err != nil {
		_ = pool.Purge(res)
		return nil, err
	}
	return &Redis{url: u, dockerC: func() { _ = pool.Purge(res) }}, nil
}

// replaceDatabase returns serverURL with its database name changed.
func replaceDatabase(serverURL, name string) string {
	if u, err := url.Parse(serverURL); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		return u.String()
	}
	// Keyword/value form: "host=... dbname=x".
	fields := strings.Fields(serverURL)
	out := fields[:0]
	for _, f := range fields {
		if !strings.HasPrefix(f, "dbname=") {
			out = append(out, f)
		}
	}
	return strings.Join(append(out, "dbname="+name), " ")
}
