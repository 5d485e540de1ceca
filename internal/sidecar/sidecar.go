// Package sidecar is the HTTP admin server of the long-running delayq commands
// (relay, worker):
//
//	/metrics   Prometheus metrics of the given Gatherer
//	/healthz   200 while the process is up (liveness)
//	/readyz    200 when every check passes (PostgreSQL and Redis reachable),
//	           503 with the failing checks otherwise (readiness)
//	/ui/       the operator's dashboard, when Config.UI is set (delayq relay --ui)
//	/forecast  and other GET endpoints of Config.Endpoints (the relay's autoscaling
//	           signal, package internal/forecast)
//
// It listens on loopback by default (127.0.0.1:9090): metrics and health are for
// the machine's own agents unless the operator chooses to expose them.
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
)

// DefaultAddr is the listen address used when Config.Addr is empty.
const DefaultAddr = "127.0.0.1:9090"

// ErrInvalidConfig reports a Config that does not validate.
var ErrInvalidConfig = errors.New("sidecar: invalid config")

// Check is one readiness check: Func returns nil when Name is ready.
type Check struct {
	Name string
	Func func(ctx context.Context) error
}

// DegradedError, returned by a check, says that it works but not fully (a relay
// repairing Redis after a loss): /readyz lists it as "degraded" with the reason and
// stays 200 unless another check fails.
type DegradedError struct{ Reason string }

func (e *DegradedError) Error() string { return e.Reason }

// PostgresCheck pings PostgreSQL through pool.
func PostgresCheck(pool *pgxpool.Pool) Check {
	return Check{Name: "postgres", Func: pool.Ping}
}

// RedisCheck pings Redis.
func RedisCheck(rdb redis.UniversalClient) Check {
	return Check{Name: "redis", Func: func(ctx context.Context) error { return rdb.Ping(ctx).Err() }}
}

// Config configures a Server. The zero value means every default.
type Config struct {
	// Addr is the listen address. Default "127.0.0.1:9090" (loopback only); use
	// ":9090" to listen on every interface, "127.0.0.1:0" for a free port.
	Addr string
	// Gatherer provides /metrics. Default prometheus.DefaultGatherer.
	Gatherer prometheus.Gatherer
	// Checks run, concurrently, for each /readyz request. Default none (always
	// ready).
	Checks []Check
	// CheckTimeout bounds each check. Default 2s.
	CheckTimeout time.Duration
	// ShutdownTimeout bounds Run's graceful shutdown. Default 5s.
	ShutdownTimeout time.Duration
	// Logger receives server errors. Default: discard.
	Logger *slog.Logger
	// UI, when set, is served under /ui/: the dashboard (package internal/ui),
	// built with BasePath "/ui" and its own authentication. Default none.
	UI http.Handler
	// Endpoints are more GET (and HEAD) routes, by path ("/forecast"), each
	// listed on the index. A path must start with '/' and not be one of the
	// server's own. Default none.
	Endpoints map[string]http.Handler
}

// UIPath is where Config.UI is mounted (its BasePath).
const UIPath = "/ui"

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.Gatherer == nil {
		c.Gatherer = prometheus.DefaultGatherer
	}
	if c.CheckTimeout == 0 {
		c.CheckTimeout = 2 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

func (c Config) validate() error {
	if c.CheckTimeout < 0 || c.ShutdownTimeout < 0 {
		return fmt.Errorf("%w: CheckTimeout %v, ShutdownTimeout %v: must be positive", ErrInvalidConfig, c.CheckTimeout, c.ShutdownTimeout)
	}
	for path, h := range c.Endpoints {
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " {}") || h == nil ||
			slices.Contains([]string{"/", "/metrics", "/healthz", "/readyz", UIPath, UIPath + "/"}, path) {
			return fmt.Errorf("%w: endpoint %q: needs a free path starting with '/' and a handler", ErrInvalidConfig, path)
		}
	}
	names := map[string]bool{}
	for _, ch := range c.Checks {
		if ch.Name == "" || ch.Func == nil || names[ch.Name] {
			return fmt.Errorf("%w: check %q: needs a unique name and a function", ErrInvalidConfig, ch.Name)
		}
		names[ch.Name] = true
	}
	return nil
}

// Server is the admin HTTP server.
type Server struct {
	cfg  Config
	srv  *http.Server
	ln   net.Listener
	done chan struct{} // closed when Serve returns
	err  error         // Serve's error, after done
}

// Start listens on cfg.Addr and serves in the background until Shutdown. A bad or
// busy address is reported here, at once.
func Start(cfg Config) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("sidecar: listen %s: %w", cfg.Addr, err)
	}
	s := &Server{cfg: cfg, ln: ln, done: make(chan struct{})}
	s.srv = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.err = err
			cfg.Logger.Error("sidecar: serve", "error", err.Error())
		}
	}()
	return s, nil
}

// Addr is the address the server listens on (with the port chosen, for ":0").
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Shutdown stops accepting connections and waits for requests in progress, until
// ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		_ = s.srv.Close()
	}
	<-s.done
	if err == nil {
		err = s.err
	}
	return err
}

// Run starts the server, serves until ctx ends, then shuts it down within
// Config.ShutdownTimeout.
func Run(ctx context.Context, cfg Config) error {
	s, err := Start(cfg)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-s.done:
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	return s.Shutdown(sctx)
}

// Handler returns the server's routes, for tests and for embedding.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Gatherer, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelWarn),
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n") //nolint:errcheck // the client went away
	})
	mux.HandleFunc("GET /readyz", s.ready)
	paths := []string{"/metrics", "/healthz", "/readyz"}
	if s.cfg.UI != nil {
		mux.Handle(UIPath+"/", s.cfg.UI)
		paths = append(paths, UIPath+"/")
	}
	var extra []string
	for path, h := range s.cfg.Endpoints {
		mux.Handle("GET "+path, h) // GET also matches HEAD
		extra = append(extra, path)
	}
	slices.Sort(extra)
	index := "delayq admin: " + strings.Join(append(paths, extra...), " ") + "\n"

	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, index) //nolint:errcheck // the client went away
	})
	return mux
}

// ready runs every check concurrently, each within CheckTimeout, and answers 200
// with "ok" lines, or 503 listing what failed.
func (s *Server) ready(w http.ResponseWriter, req *http.Request) {
	type result struct {
		name string
		err  error
	}
	results := make([]result, len(s.cfg.Checks))
	var wg sync.WaitGroup
	for i, ch := range s.cfg.Checks {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(req.Context(), s.cfg.CheckTimeout)
			defer cancel()
			err := ch.Func(ctx)
			if err != nil && ctx.Err() != nil {
				err = fmt.Errorf("no answer within %v", s.cfg.CheckTimeout)
			}
			results[i] = result{ch.Name, err}
		})
	}
	wg.Wait()
	sort.Slice(results, func(i, j int) bool { return results[i].name < results[j].name })
	var b strings.Builder
	code := http.StatusOK
	for _, r := range results {
		var degraded *DegradedError
		if errors.As(r.err, &degraded) {
			fmt.Fprintf(&b, "%s: degraded: %s\n", r.name, strings.Join(strings.Fields(degraded.Reason), " "))
			continue
		}
		if r.err != nil {
			code = http.StatusServiceUnavailable
			fmt.Fprintf(&b, "%s: %s\n", r.name, strings.Join(strings.Fields(r.err.Error()), " "))
		} else {
			fmt.Fprintf(&b, "%s: ok\n", r.name)
		}
	}
	if len(results) == 0 {
		b.WriteString("ok\n")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	io.WriteString(w, b.String()) //nolint:errcheck // the client went away
}
