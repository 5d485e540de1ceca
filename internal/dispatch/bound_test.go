package dispatch

import (
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
)

// On hands back the client a Redis client is bound to, refuses another prefix
// for it, and builds a new client on a plain one.
func TestOn(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	dq, err := New(rdb, Config{Prefix: "tools"})
	if err != nil {
		t.Fatal(err)
	}
	for _, prefix := range []string{"", "tools"} {
		if got, err := On(dq.AsRedis(), Config{Prefix: prefix}); err != nil || got != dq {
			t.Errorf("prefix %q: %p, %v; want the bound client %p", prefix, got, err, dq)
		}
	}
	if _, err := On(dq.AsRedis(), Config{Prefix: "other"}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("another prefix: %v, want ErrInvalidConfig", err)
	}
	got, err := On(rdb, Config{Prefix: "plain"})
	if err != nil || got == dq || got.Config().Prefix != "plain" {
		t.Errorf("plain client: %+v, %v", got, err)
	}
}
