package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/delayq/delayq/internal/sidecar"
)

// runHealthcheck GETs the admin server of a relay or worker running beside it
// (in the same container) and exits 0 on a 2xx answer, 1 otherwise. It is the
// Dockerfile's HEALTHCHECK: the image has no shell, curl or wget.
func runHealthcheck(ctx context.Context, m *Main, args []string) error {
	fs := newFlagSet(m, "healthcheck", "healthcheck [flags]",
		"  delayq healthcheck                          # GET http://127.0.0.1:9090/healthz (the relay's default --listen)\n"+
			"  delayq healthcheck --addr :9090             # the relay run with --listen :9090\n"+
			"  delayq healthcheck --addr :9091 --path /readyz   # a worker's readiness (PostgreSQL and Redis reachable)\n"+
			"  HEALTHCHECK CMD [\"/delayq\", \"healthcheck\", \"--addr\", \":9090\"]   # in a Dockerfile\n")
	addr := fs.String("addr", sidecar.DefaultAddr, "the admin server's address, as given to --listen of relay or worker (an empty or wildcard host means loopback)")
	path := fs.String("path", "/healthz", "the path to GET: /healthz (the process is up) or /readyz (its servers are reachable)")
	timeout := fs.Duration("timeout", 3*time.Second, "give up after this long")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *timeout <= 0 {
		return usagef("--timeout %v: must be positive", *timeout)
	}
	if !strings.HasPrefix(*path, "/") {
		return usagef("--path %q: must start with /", *path)
	}
	target, err := healthcheckURL(*addr, *path)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return usagef("%v", err)
	}
	// No proxy from the environment: the server is on this machine.
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: no answer within %v", target, *timeout)
		}
		return fmt.Errorf("%s: %w", target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("%s: %s: %s", target, resp.Status, oneLine(string(body)))
	}
	fmt.Fprintf(m.Stdout, "%s: %s\n", target, resp.Status)
	return nil
}

// healthcheckURL turns a --listen style address into the URL to GET: a missing,
// 0.0.0.0 or :: host becomes loopback, since the check runs beside the server.
func healthcheckURL(addr, path string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return "", usagef("--addr %q: want host:port or :port", addr)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::", "[::]":
		host = "::1"
	}
	return "http://" + net.JoinHostPort(host, port) + path, nil
}
