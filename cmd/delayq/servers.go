//go:build delayqdev

package main

// This file is built only with -tags delayqdev (make demo, make bench): it links
// internal/tempserver, test tooling the relay and CLI binary must not carry.
// servers_stub.go stands in for it otherwise. (The Docker fallback is not here:
// make passes the URLs of containers it started, internal/dev/withservers.)

import (
	"context"
	"fmt"

	"github.com/delayq/delayq/internal/tempserver"
)

// throwawayServers fills in the URLs the user did not give by starting throwaway
// servers from local binaries. The returned stop removes them.
func (m *Main) throwawayServers(ctx context.Context, conn *connFlags, durable bool) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	if conn.databaseURL == "" {
		fmt.Fprintln(m.Stderr, "delayq: no DATABASE_URL: starting a throwaway PostgreSQL…")
		pg, err := tempserver.StartPostgres(ctx, tempserver.PostgresOptions{Durable: durable})
		if err != nil {
			return stop, err
		}
		stops = append(stops, pg.Close)
		conn.databaseURL = pg.URL()
	}
	if conn.redisURL == "" {
		fmt.Fprintln(m.Stderr, "delayq: no REDIS_URL: starting a throwaway Redis…")
		r, err := tempserver.StartRedis(ctx, tempserver.RedisOptions{})
		if err != nil {
			stop()
			return func() {}, err
		}
		stops = append(stops, r.Close)
		conn.redisURL = r.URL()
	}
	return stop, nil
}
