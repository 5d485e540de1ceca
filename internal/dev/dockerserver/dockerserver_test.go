package dockerserver

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// TestContainers starts both containers and talks to them. Without a reachable
// Docker daemon it skips, unless DELAYQ_REQUIRE_DOCKER is set (a CI machine that
// has Docker and must not silently skip).
func TestContainers(t *testing.T) {
	if err := Available(); err != nil {
		if os.Getenv("DELAYQ_REQUIRE_DOCKER") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	pg, err := Postgres(ctx, PostgresOptions{MaxConnections: 50})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := pg.Close(); err != nil {
			t.Error(err)
		}
	}()
	conn, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	var maxConns string
	if err := conn.QueryRow(ctx, "SHOW max_connections").Scan(&maxConns); err != nil || maxConns != "50" {
		t.Errorf("max_connections %q, %v", maxConns, err)
	}
	_ = conn.Close(ctx)

	r, err := Redis(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	}()
	opt, err := redis.ParseURL(r.URL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := rdb.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("get: %q %v", v, err)
	}
}
