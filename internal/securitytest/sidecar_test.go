package securitytest

import (
	"context"
	"errors"
	"net"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/sidecar"
)

// isLoopback reports whether the host of addr is a loopback address.
func isLoopback(t *testing.T, addr string) bool {
	t.Helper()
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// nonLoopbackIP returns an address of this machine that is not loopback, if any.
func nonLoopbackIP() net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP
		}
	}
	return nil
}

// TestAdminServerLoopbackByDefault: the admin server (/metrics, /healthz,
// /readyz) listens on a loopback address unless told otherwise, in the library
// and in both commands' flags; a server on the default is not reachable from
// another interface; the address is configurable.
func TestAdminServerLoopbackByDefault(t *testing.T) {
	t.Parallel()
	if !isLoopback(t, sidecar.DefaultAddr) {
		t.Errorf("sidecar.DefaultAddr %q is not loopback", sidecar.DefaultAddr)
	}
	if got := (sidecar.Config{}).WithDefaults().Addr; got != sidecar.DefaultAddr {
		t.Errorf("zero Config listens on %q, want %q", got, sidecar.DefaultAddr)
	}
	// The commands' --listen defaults, as --help prints them.
	for _, cmd := range []string{"relay", "worker"} {
		r := runBin(t, nil, "", cmd, "--help")
		m := regexp.MustCompile(`(?m)^\s+-listen string\n.*\(default "([^"]*)"\)`).FindStringSubmatch(r.stdout)
		if r.code != 0 || m == nil {
			t.Fatalf("%s --help: exit %d, no --listen default:\n%s", cmd, r.code, r.stdout)
		}
		if !isLoopback(t, m[1]) {
			t.Errorf("%s --listen defaults to %q, not loopback", cmd, m[1])
		}
	}

	// A server started with the zero Config: on loopback, and not reachable through
	// another interface of the machine. (Skipped when another process holds the
	// default port.)
	s, err := sidecar.Start(sidecar.Config{})
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		t.Logf("default port busy, zero-Config server not checked: %v", err)
	case err != nil:
		t.Fatal(err)
	default:
		if !isLoopback(t, s.Addr()) {
			t.Errorf("zero-Config server listens on %s", s.Addr())
		}
		if ip := nonLoopbackIP(); ip != nil {
			_, port, _ := net.SplitHostPort(s.Addr())
			if c, err := net.DialTimeout("tcp", net.JoinHostPort(ip.String(), port), 2*time.Second); err == nil {
				c.Close()
				t.Errorf("the default admin server answers on %s", ip)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}

	// Configurable: any address given is the one used.
	s2, err := sidecar.Start(sidecar.Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, port, _ := net.SplitHostPort(s2.Addr()); port == "0" || !isLoopback(t, s2.Addr()) {
		t.Errorf("server on 127.0.0.1:0 listens on %s", s2.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s2.Shutdown(ctx); err != nil {
		t.Error(err)
	}
}
