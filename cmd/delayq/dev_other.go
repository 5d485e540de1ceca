//go:build !unix

package main

import "context"

// runDev needs internal/tempserver, which starts servers on Unix systems only.
func runDev(context.Context, *Main, []string) error {
	return usagef("dev starts local servers on Unix systems only: set DATABASE_URL and REDIS_URL to servers you run")
}
