package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/sidecar"
)

// sidecarFlags are the flags of the long-running commands (relay, worker) but
// the connection's: the admin server's address, the log's format and level.
type sidecarFlags struct {
	listen, logFormat, logLevel string
}

func (f *sidecarFlags) register(fs *flagSet, defaultListen, listenUsage string) {
	fs.StringVar(&f.listen, "listen", defaultListen, listenUsage)
	fs.StringVar(&f.logFormat, "log-format", "text", "log format on standard error: text or json")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
}

// open makes the process logger and connects to both servers.
func (f *sidecarFlags) open(ctx context.Context, m *Main, conn *connFlags) (*slog.Logger, *sidecarDeps, error) {
	logger, err := newLogger(m, f.logFormat, f.logLevel)
	if err != nil {
		return nil, nil, err
	}
	deps, err := conn.openSidecar(ctx, logger)
	return logger, deps, err
}

// sidecarDeps is what the long-running commands (relay, worker) connect to: both
// servers, a delayq client and a Prometheus registry with the process collectors.
type sidecarDeps struct {
	pool *pgxpool.Pool
	rdb  redis.UniversalClient
	dq   *dispatch.Client
	reg  *prometheus.Registry
}

// registerer is where a command's own collectors go: the registry, with the
// label database=<key> when the command serves one of several databases (the
// library's parts add it to theirs).
func (s *sidecarDeps) registerer(database string) prometheus.Registerer {
	if database == "" {
		return s.reg
	}
	return prometheus.WrapRegistererWith(prometheus.Labels{"database": database}, s.reg)
}

func (c *connFlags) openSidecar(ctx context.Context, logger *slog.Logger) (*sidecarDeps, error) {
	pool, err := c.openPostgres(ctx)
	if err != nil {
		return nil, err
	}
	rdb, err := c.openRedis(ctx)
	if err != nil {
		pool.Close()
		return nil, err
	}
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: c.namespace(), Logger: logger})
	if err != nil {
		pool.Close()
		_ = rdb.Close()
		return nil, usagef("%v", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &sidecarDeps{pool: pool, rdb: rdb, dq: dq, reg: reg}, nil
}

// startAdmin serves /metrics, /healthz and /readyz (both servers checked, and the
// extra checks) on listen; an empty listen serves nothing and returns nil.
func (s *sidecarDeps) startAdmin(listen string, logger *slog.Logger, extra ...sidecar.Check) (*sidecar.Server, error) {
	return s.startAdminUI(listen, logger, nil, extra...)
}

// startAdminUI is startAdmin that also serves the dashboard ui (nil: none) under
// sidecar.UIPath.
func (s *sidecarDeps) startAdminUI(listen string, logger *slog.Logger, ui http.Handler, extra ...sidecar.Check) (*sidecar.Server, error) {
	return s.startAdminWith(listen, logger, ui, nil, extra...)
}

// startAdminWith is startAdminUI that also serves endpoints (GET routes by
// path: the relay's /forecast).
func (s *sidecarDeps) startAdminWith(listen string, logger *slog.Logger, ui http.Handler, endpoints map[string]http.Handler, extra ...sidecar.Check) (*sidecar.Server, error) {
	if listen == "" {
		return nil, nil
	}
	return sidecar.Start(sidecar.Config{
		Addr:      listen,
		Gatherer:  s.reg,
		Checks:    append([]sidecar.Check{sidecar.PostgresCheck(s.pool), sidecar.RedisCheck(s.rdb)}, extra...),
		Logger:    logger,
		UI:        ui,
		Endpoints: endpoints,
	})
}

func (s *sidecarDeps) close() {
	s.pool.Close()
	_ = s.rdb.Close()
}

// stopAdmin shuts the admin server down (nil: there is none) once the run
// ended with runErr, and returns runErr, else the shutdown's error.
func stopAdmin(ctx context.Context, admin *sidecar.Server, runErr error) error {
	if admin == nil {
		return runErr
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := admin.Shutdown(sctx); err != nil && runErr == nil {
		return fmt.Errorf("admin server shutdown: %w", err)
	}
	return runErr
}

func adminAddr(s *sidecar.Server) string {
	if s == nil {
		return "off"
	}
	return "http://" + s.Addr()
}

// newLogger makes the process logger on standard error.
func newLogger(m *Main, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler
	switch format {
	case "text":
		h = slog.NewTextHandler(m.Stderr, opts)
	case "json":
		h = slog.NewJSONHandler(m.Stderr, opts)
	default:
		return nil, usagef("--log-format %q: want text or json", format)
	}
	m.goRedis.set(h) // go-redis's lines, from now on (main)
	return slog.New(h), nil
}
