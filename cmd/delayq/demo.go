package main

import (
	"context"
	"fmt"
	"time"

	"github.com/delayq/delayq/internal/demo"
)

func runDemo(ctx context.Context, m *Main, args []string) error {
	// demo --ui is delayq ui --demo: a live workload to watch in the browser.
	for i, a := range args {
		if a == "--ui" || a == "-ui" {
			return runUI(ctx, m, append([]string{"--demo"}, append(args[:i:i], args[i+1:]...)...))
		}
	}
	var conn connFlags
	fs := newFlagSet(m, "demo", "demo [flags]",
		"  make demo                      # in a checkout: throwaway PostgreSQL and Redis, started and removed for you\n"+
			"  DATABASE_URL=postgres://localhost/app REDIS_URL=redis://localhost:6379 delayq demo\n"+
			"                                 # your servers: the demo works in a schema and key prefix of its own and removes them\n"+
			"  delayq demo --ui               # a live workload (orders, some failing, some dying) to watch on http://127.0.0.1:8080\n"+
			"                                 # (delayq ui --demo; its flags: --listen, --token, --read-only ...)\n"+
			"Without the URLs, only a binary built with -tags "+devTag+" (as make demo builds it) starts throwaway servers.\n")
	conn.register(fs, m, true, true)
	orders := fs.Int("orders", 3000, "order transactions to attempt")
	spread := fs.Duration("spread", 3*time.Second, "window the tasks fall due in")
	timeout := fs.Duration("timeout", 90*time.Second, "give up after this long")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *orders < 1 || *orders > 1_000_000 {
		return usagef("--orders %d: want 1..1000000", *orders)
	}
	if *spread <= 0 || *timeout <= 0 {
		return usagef("--spread and --timeout must be positive")
	}
	if err := conn.checkURLs(); err != nil {
		return err
	}
	stop, err := m.throwawayServers(ctx, &conn, false)
	defer stop()
	if err != nil {
		return err
	}
	_, err = demo.Run(ctx, demo.Config{
		DatabaseURL: conn.databaseURL, RedisURL: conn.redisURL,
		Orders: *orders, Spread: *spread, Timeout: *timeout,
		Out: m.Stdout, Live: isTerminal(m.Stdout),
	})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	return nil
}
