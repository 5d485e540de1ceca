package main

import (
	"cmp"
	"context"
	"errors"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/validate"
)

// stores is what an operator command works on: the delayq client on the two
// servers, and the servers themselves for what the client does not offer (see
// the commands).
type stores struct {
	client *delayq.Client
	pool   *pgxpool.Pool
	rdb    redis.UniversalClient // noRedis when the command reads PostgreSQL alone
	// dq is the Redis engine on rdb, for the calls the client lacks (nil
	// without Redis).
	dq *dispatch.Client
}

// errNoRedisURL is what a command that was given no Redis URL gets if it tries
// Redis all the same.
var errNoRedisURL = usagef("no Redis URL: set REDIS_URL or --redis-url")

// openStores checks the URLs and the key prefix, then connects, and returns the
// client on the two servers: a mistake in the input is found before anything
// connects (the command's options were checked before). With needRedis false
// the command reads PostgreSQL alone, and the client's Redis is noRedis.
func (c *connFlags) openStores(ctx context.Context, needRedis bool) (*stores, error) {
	if err := c.checkPostgres(); err != nil {
		return nil, err
	}
	if _, err := newOutbox(c.schema); err != nil { // the schema, by the library's rule
		return nil, err
	}
	if needRedis {
		if err := validate.Prefix(c.prefix); err != nil {
			return nil, usagef("--prefix: %v", err)
		}
		if err := c.checkRedis(); err != nil {
			return nil, err
		}
	}
	pool, err := c.openPostgres(ctx)
	if err != nil {
		return nil, err
	}
	var rdb redis.UniversalClient
	if !needRedis {
		rdb = noRedis()
	} else if rdb, err = c.openRedis(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	s := &stores{pool: pool, rdb: rdb}
	prefix := cmp.Or(c.prefix, dispatch.DefaultPrefix)
	if s.client, err = delayq.New(pool, rdb, delayq.Config{Schema: c.schema, Prefix: prefix, Database: c.database}); err == nil && needRedis {
		s.dq, err = dispatch.New(rdb, dispatch.Config{Prefix: dispatch.Namespace(prefix, c.database)})
	}
	if err != nil {
		s.close()
		return nil, usagef("%s", libraryMessage(err, delayq.ErrInvalidConfig))
	}
	return s, nil
}

func (s *stores) close() {
	s.pool.Close()
	_ = s.rdb.Close()
}

// noRedis stands in for Redis where a command was given no Redis URL (the
// client needs one): every call on it fails with errNoRedisURL, without a dial.
// Without maintenance notifications it starts no goroutine.
func noRedis() redis.UniversalClient {
	return redis.NewClient(&redis.Options{
		Dialer:                   func(context.Context, string, string) (net.Conn, error) { return nil, errNoRedisURL },
		MaxRetries:               -1,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// libraryMessage is err's message without the sentinel's own words in front:
// the library's "worker: invalid config: schema ..." reads "schema ..." on the
// command line.
func libraryMessage(err, sentinel error) string {
	msg := err.Error()
	if errors.Is(err, sentinel) {
		msg = strings.TrimPrefix(msg, sentinel.Error()+": ")
	}
	return msg
}
