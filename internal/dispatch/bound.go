package dispatch

import (
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Bound is a Redis client that carries the dispatch Client built on it. The
// module's own tools (tests, benchmarks, the CLI) configure a dispatch Client
// of their own and hand it to delayq.New in place of a plain Redis client;
// delayq.New then uses that Client. Users never meet it: this package is
// internal.
type Bound struct {
	redis.UniversalClient
	Client *Client
}

// AsRedis returns c's Redis client, bound to c.
func (c *Client) AsRedis() redis.UniversalClient { return Bound{UniversalClient: c.rdb, Client: c} }

// On returns the dispatch Client for rdb: the one rdb is bound to (whose prefix
// must be cfg.Prefix when that is set), or a new one with cfg.
func On(rdb redis.UniversalClient, cfg Config) (*Client, error) {
	if b, ok := rdb.(Bound); ok {
		if p := b.Client.Config().Prefix; cfg.Prefix != "" && cfg.Prefix != p {
			return nil, fmt.Errorf("%w: Prefix %q, the Redis client's %q", ErrInvalidConfig, cfg.Prefix, p)
		}
		return b.Client, nil
	}
	return New(rdb, cfg)
}
