//go:build !delayqdev

package main

import "context"

// throwawayServers, in a binary built without -tags delayqdev, starts nothing:
// it refuses unless both URLs were given.
func (m *Main) throwawayServers(_ context.Context, conn *connFlags, _ bool) (stop func(), err error) {
	stop = func() {}
	if conn.databaseURL == "" || conn.redisURL == "" {
		return stop, usagef("no DATABASE_URL or REDIS_URL, and this binary starts no throwaway servers " +
			"(it is built without -tags " + devTag + "): set both URLs, or run `make demo` in a checkout of delayq")
	}
	return stop, nil
}
