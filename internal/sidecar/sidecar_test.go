package sidecar_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/delayq/delayq/internal/sidecar"
	"github.com/delayq/delayq/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// start runs a server on a free loopback port for the test.
func start(t *testing.T, cfg sidecar.Config) *sidecar.Server {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	s, err := sidecar.Start(cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return s
}

func get(t *testing.T, s *sidecar.Server, path string) (int, string) {
	t.Helper()
	// No keep-alive: an idle connection's goroutines would count as a leak.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + s.Addr() + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	cfg := sidecar.Config{}.WithDefaults()
	if cfg.Addr != "127.0.0.1:9090" {
		t.Errorf("default Addr %q, want loopback 127.0.0.1:9090", cfg.Addr)
	}
	if cfg.Gatherer != prometheus.DefaultGatherer || cfg.CheckTimeout != 2*time.Second {
		t.Errorf("defaults: %+v", cfg)
	}
}

func TestMetricsAndHealth(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "sidecar_test_total", Help: "a test counter"})
	reg.MustRegister(c)
	c.Add(7)
	s := start(t, sidecar.Config{Gatherer: reg})

	code, body := get(t, s, "/metrics")
	if code != http.StatusOK || !strings.Contains(body, "sidecar_test_total 7") {
		t.Errorf("/metrics: %d %q, want 200 with sidecar_test_total 7", code, body)
	}
	if code, body := get(t, s, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, s, "/readyz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/readyz without checks: %d %q", code, body)
	}
	if code, _ := get(t, s, "/nope"); code != http.StatusNotFound {
		t.Errorf("/nope: %d, want 404", code)
	}
}

func TestReadyChecks(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	s := start(t, sidecar.Config{
		Gatherer:     prometheus.NewRegistry(),
		CheckTimeout: 100 * time.Millisecond,
		Checks: []sidecar.Check{
			{Name: "good", Func: func(context.Context) error { return nil }},
			{Name: "bad", Func: func(context.Context) error { return errors.New("down\nfor good") }},
			{Name: "slow", Func: func(ctx context.Context) error {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-release:
					return nil
				}
			}},
		},
	})
	t0 := time.Now()
	code, body := get(t, s, "/readyz")
	if el := time.Since(t0); el > 2*time.Second {
		t.Errorf("/readyz took %v with a 100ms check timeout", el)
	}
	want := "bad: down for good\ngood: ok\nslow: no answer within 100ms\n"
	if code != http.StatusServiceUnavailable || body != want {
		t.Errorf("/readyz: %d %q, want 503 %q", code, body, want)
	}
}

// A degraded check is listed with its reason and keeps /readyz at 200.
func TestReadyDegraded(t *testing.T) {
	t.Parallel()
	s := start(t, sidecar.Config{
		Gatherer: prometheus.NewRegistry(),
		Checks: []sidecar.Check{
			{Name: "consistency", Func: func(context.Context) error {
				return &sidecar.DegradedError{Reason: "Redis lost data (shards 0) (repairing for 2s)"}
			}},
			{Name: "postgres", Func: func(context.Context) error { return nil }},
		},
	})
	code, body := get(t, s, "/readyz")
	if want := "consistency: degraded: Redis lost data (shards 0) (repairing for 2s)\npostgres: ok\n"; code != http.StatusOK || body != want {
		t.Errorf("/readyz: %d %q, want 200 %q", code, body, want)
	}
}

func TestReadyRealServers(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	own := testenv.OwnRedis(t)
	rdb := testenv.RedisClient(t, own.URL())
	s := start(t, sidecar.Config{
		Gatherer: prometheus.NewRegistry(),
		Checks:   []sidecar.Check{sidecar.PostgresCheck(pool), sidecar.RedisCheck(rdb)},
	})
	if code, body := get(t, s, "/readyz"); code != http.StatusOK || body != "postgres: ok\nredis: ok\n" {
		t.Fatalf("/readyz, both up: %d %q", code, body)
	}
	own.Stop()
	code, body := get(t, s, "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "postgres: ok\n") || !strings.HasPrefix(strings.Split(body, "\n")[1], "redis: ") || strings.Contains(body, "redis: ok") {
		t.Errorf("/readyz, Redis stopped: %d %q, want 503 naming redis", code, body)
	}
	if code, _ := get(t, s, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with Redis down: %d, want 200 (the process is up)", code)
	}
	if err := own.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, s, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz, Redis back: %d %q", code, body)
	}
}

func TestShutdownAndRun(t *testing.T) {
	t.Parallel()
	// A metric only this server shows: after Shutdown its port may be reused by
	// another test's server at once, so a refused dial is not the test.
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "sidecar_shutdown_marker", Help: "marker"}))
	s, err := sidecar.Start(sidecar.Config{Addr: "127.0.0.1:0", Gatherer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, s, "/metrics"); code != http.StatusOK || !strings.Contains(body, "sidecar_shutdown_marker") {
		t.Fatalf("/metrics: %d %q", code, body)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	if resp, err := client.Get("http://" + s.Addr() + "/metrics"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "sidecar_shutdown_marker") {
			t.Errorf("the server still answers after Shutdown")
		}
	}

	// A busy address is reported by Start (and Run) at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := sidecar.Run(context.Background(), sidecar.Config{Addr: ln.Addr().String()}); err == nil || !strings.Contains(err.Error(), "listen") {
		t.Errorf("Run on a busy address: %v, want a listen error", err)
	}

	// Run serves until its context ends.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sidecar.Run(ctx, sidecar.Config{Addr: "127.0.0.1:0"}) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func TestInvalidConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []sidecar.Config{
		{Checks: []sidecar.Check{{Name: "", Func: func(context.Context) error { return nil }}}},
		{Checks: []sidecar.Check{{Name: "x"}}},
		{Checks: []sidecar.Check{{Name: "x", Func: func(context.Context) error { return nil }}, {Name: "x", Func: func(context.Context) error { return nil }}}},
		{CheckTimeout: -1},
	} {
		if _, err := sidecar.Start(cfg); !errors.Is(err, sidecar.ErrInvalidConfig) {
			t.Errorf("Start(%+v): %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// Endpoints are served on GET and listed on the index; a path that is not free
// or not a path is refused.
func TestEndpoints(t *testing.T) {
	t.Parallel()
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "forecast\n") })
	s := start(t, sidecar.Config{Gatherer: prometheus.NewRegistry(), Endpoints: map[string]http.Handler{"/forecast": h}})
	if code, body := get(t, s, "/forecast"); code != http.StatusOK || body != "forecast\n" {
		t.Errorf("/forecast: %d %q", code, body)
	}
	if code, body := get(t, s, "/"); code != http.StatusOK || body != "delayq admin: /metrics /healthz /readyz /forecast\n" {
		t.Errorf("/: %d %q", code, body)
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Post("http://"+s.Addr()+"/forecast", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /forecast: %d", resp.StatusCode)
	}
	for _, path := range []string{"forecast", "/metrics", "/", "/ui", "/a b", "/{x}"} {
		if _, err := sidecar.Start(sidecar.Config{Addr: "127.0.0.1:0", Endpoints: map[string]http.Handler{path: h}}); !errors.Is(err, sidecar.ErrInvalidConfig) {
			t.Errorf("endpoint %q: %v, want ErrInvalidConfig", path, err)
		}
	}
	if _, err := sidecar.Start(sidecar.Config{Addr: "127.0.0.1:0", Endpoints: map[string]http.Handler{"/x": nil}}); !errors.Is(err, sidecar.ErrInvalidConfig) {
		t.Errorf("endpoint without a handler: %v", err)
	}
}
