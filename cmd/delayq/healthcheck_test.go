package main

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/sidecar"
)

// TestHealthcheck runs `delayq healthcheck` against a real admin server: 0 while
// /healthz answers, 1 with one error line when a path fails or nothing listens,
// 2 for a malformed flag.
func TestHealthcheck(t *testing.T) {
	t.Parallel()
	srv, err := sidecar.Start(sidecar.Config{
		Addr:   "127.0.0.1:0",
		Checks: []sidecar.Check{{Name: "redis", Func: func(context.Context) error { return errors.New("connection refused") }}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	_, port, _ := net.SplitHostPort(srv.Addr())

	cliRun(t, nil, "healthcheck", "--addr", srv.Addr()).want(t, exitOK, "/healthz: 200 OK")
	// --listen's forms: a wildcard or empty host is checked on loopback.
	cliRun(t, nil, "healthcheck", "--addr", ":"+port).want(t, exitOK, "http://127.0.0.1:"+port+"/healthz: 200 OK")
	cliRun(t, nil, "healthcheck", "--addr", "0.0.0.0:"+port).want(t, exitOK)

	r := cliRun(t, nil, "healthcheck", "--addr", srv.Addr(), "--path", "/readyz")
	r.want(t, exitFailure)
	r.oneLineErr(t, "503 Service Unavailable: redis: connection refused")

	// Nothing listens there any more.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	r = cliRun(t, nil, "healthcheck", "--addr", closed, "--timeout", "2s")
	r.want(t, exitFailure)
	r.oneLineErr(t, "connection refused")

	for _, args := range [][]string{{"--addr", "9090"}, {"--path", "healthz"}, {"--timeout", "0s"}, {"extra"}} {
		cliRun(t, nil, append([]string{"healthcheck"}, args...)...).want(t, exitUsage)
	}
}

// TestHealthcheckTimeout: a server that never answers fails the check within
// --timeout.
func TestHealthcheckTimeout(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { <-done; c.Close() }() // read nothing, answer nothing
		}
	}()
	start := time.Now()
	r := cliRun(t, nil, "healthcheck", "--addr", ln.Addr().String(), "--timeout", "300ms")
	r.want(t, exitFailure)
	r.oneLineErr(t, "no answer within 300ms")
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("healthcheck took %v with --timeout 300ms", el)
	}
}

func TestHealthcheckURL(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"127.0.0.1:9090": "http://127.0.0.1:9090/healthz",
		":9090":          "http://127.0.0.1:9090/healthz",
		"0.0.0.0:9091":   "http://127.0.0.1:9091/healthz",
		"[::]:9090":      "http://[::1]:9090/healthz",
		"localhost:80":   "http://localhost:80/healthz",
	} {
		if got, err := healthcheckURL(addr, "/healthz"); err != nil || got != want {
			t.Errorf("healthcheckURL(%q) = %q, %v; want %q", addr, got, err, want)
		}
	}
	if _, err := healthcheckURL("9090", "/healthz"); err == nil {
		t.Error(`healthcheckURL("9090") succeeded`)
	}
}
