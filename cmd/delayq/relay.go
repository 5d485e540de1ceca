package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/delayq/delayq/internal/sidecar"
	"github.com/delayq/delayq/internal/ui"
	"github.com/delayq/delayq/relay"
	"github.com/delayq/delayq/schedule"
)

func runRelay(ctx context.Context, m *Main, args []string) error {
	var (
		conn         connFlags
		horizon      time.Duration
		batch        int
		pollInterval time.Duration
		reapInterval time.Duration
		retention    time.Duration
		listen       string
		queues       string
		logFormat    string
		logLevel     string
		schedules    string
		repairRate   int
		repairPause  time.Duration
		pollOnly     bool
		withUI       bool
		uiReadOnly   bool
	)
	fs := newFlagSet(m, "relay", "relay [flags]",
		"  DATABASE_URL=postgres://app@db/app REDIS_URL=redis://cache:6379 delayq relay\n"+
			"  delayq relay --horizon 10m --listen :9090 --log-format json\n"+
			"  delayq relay --queues payment,mail          # only these queues (one relay per group)\n"+
			"  delayq relay --schedules schedules.yaml     # also enqueue periodic tasks (see delayq schedules --help)\n"+
			"  delayq relay --poll-only --poll-interval 1s # behind PgBouncer in transaction mode (no LISTEN)\n"+
			"  DELAYQ_UI_TOKEN=$(cat /run/secrets/ui) delayq relay --ui   # the dashboard too, on http://127.0.0.1:9090/ui/\n")
	conn.register(fs, m, true, true)
	fs.DurationVar(&horizon, "horizon", relay.DefaultHorizon, "move rows due within this time to Redis; later ones wait in PostgreSQL")
	fs.IntVar(&batch, "batch", relay.DefaultBatchSize, "most rows one round moves (1..10000)")
	fs.DurationVar(&pollInterval, "poll-interval", relay.DefaultPollInterval, "longest wait between rounds, the backstop for missed notifications")
	fs.BoolVar(&pollOnly, "poll-only", false, "poll instead of LISTEN, for PgBouncer in transaction mode: rows due sooner than --poll-interval after their commit reach Redis up to that late (add ?default_query_exec_mode=simple_protocol to the URL)")
	fs.DurationVar(&reapInterval, "reap-interval", relay.DefaultReapInterval, "how often expired leases are taken back; 0 turns the reaper off")
	fs.DurationVar(&retention, "retention", relay.DefaultRetention, "delete done and cancelled rows this long after they finished; 0 keeps them")
	fs.StringVar(&listen, "listen", sidecar.DefaultAddr, "address of /metrics, /healthz and /readyz (loopback by default; ':9090' for all interfaces; empty for none)")
	fs.StringVar(&queues, "queues", "", "comma-separated queues to relay and reap (default: all)")
	fs.IntVar(&repairRate, "repair-rate", relay.DefaultRepairRate, "queued rows a second the self-healing pass compares with Redis; 0 turns self-healing (and Redis loss detection) off")
	fs.DurationVar(&repairPause, "repair-pause", relay.DefaultRepairPause, "pause between two self-healing passes")
	fs.StringVar(&logFormat, "log-format", "text", "log format on standard error: text or json")
	fs.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.BoolVar(&withUI, "ui", false, "also serve the dashboard under /ui/ on the --listen address; its actions need "+uiTokenEnv+" or "+uiBasicEnv+" (or --ui-read-only)")
	fs.BoolVar(&uiReadOnly, "ui-read-only", false, "with --ui: serve the dashboard without any action")
	fs.StringVar(&schedules, "schedules", "", "YAML `file` of periodic tasks to enqueue, each tick once across relays (see delayq schedules --help)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("unexpected argument %q (see --help)", fs.Arg(0))
	}

	logger, err := newLogger(m, logFormat, logLevel)
	if err != nil {
		return err
	}
	if repairRate < 0 {
		return usagef("--repair-rate %d: rows a second, 0 for off", repairRate)
	}
	if repairRate == 0 {
		repairRate = -1
	}
	cfg := relay.Config{
		RepairRate:   repairRate,
		RepairPause:  repairPause,
		Schema:       conn.schema,
		Horizon:      horizon,
		BatchSize:    batch,
		PollInterval: pollInterval,
		PollOnly:     pollOnly,
		ReapInterval: offIfZero(reapInterval),
		Retention:    offIfZero(retention),
		Logger:       logger,
	}
	if schedules != "" {
		if cfg.Schedules, err = schedule.Load(schedules); err != nil {
			return usagef("--schedules: %v", err)
		}
	}
	if queues != "" {
		for q := range strings.SplitSeq(queues, ",") {
			if q = strings.TrimSpace(q); q != "" {
				cfg.Queues = append(cfg.Queues, q)
			}
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"horizon", horizon}, {"poll-interval", pollInterval}, {"reap-interval", reapInterval}, {"retention", retention}} {
		if d.v < 0 || d.v == 0 && (d.name == "horizon" || d.name == "poll-interval") {
			return usagef("--%s %v: must be positive", d.name, d.v)
		}
	}
	if batch < 1 || batch > 10000 {
		return usagef("--batch %d: 1..10000", batch)
	}
	if err := cfg.Validate(); err != nil {
		return usagef("%s", strings.TrimPrefix(err.Error(), relay.ErrInvalidConfig.Error()+": "))
	}
	var uiCfg ui.Config
	if withUI {
		if listen == "" {
			return usagef("--ui: serves on the --listen address, which is empty")
		}
		// Secure by default, as delayq ui: credentials from the environment, else
		// no dashboard (a relay prints no token to its logs).
		uiCfg, err = uiCredentials(m.Getenv(uiTokenEnv), m.Getenv(uiBasicEnv), uiReadOnly)
		if err != nil {
			return err
		}
		if !uiReadOnly && uiCfg.Token == "" && uiCfg.BasicUser == "" {
			return usagef("--ui: actions need %s or %s in the environment (or --ui-read-only)", uiTokenEnv, uiBasicEnv)
		}
	} else if uiReadOnly {
		return usagef("--ui-read-only: only with --ui")
	}

	deps, err := conn.openSidecar(ctx, logger)
	if err != nil {
		return err
	}
	defer deps.close()
	cfg.Registerer = deps.reg
	rl, err := relay.New(deps.pool, deps.dq, cfg)
	if err != nil {
		return err
	}
	if err := rl.CheckOutbox(ctx); err != nil {
		return err
	}

	// /readyz says degraded, with the reason, while the relay repairs Redis after
	// a detected loss.
	consistency := sidecar.Check{Name: "consistency", Func: func(context.Context) error {
		if reason, repairing := rl.Repairing(); repairing {
			return &sidecar.DegradedError{Reason: reason}
		}
		return nil
	}}
	var dash http.Handler
	if withUI {
		ob, err := newOutbox(conn.schema)
		if err != nil {
			return err
		}
		uiCfg.DB, uiCfg.Redis, uiCfg.Outbox, uiCfg.BasePath, uiCfg.Logger = deps.pool, deps.dq, ob, sidecar.UIPath, logger
		if dash, err = ui.New(uiCfg); err != nil {
			return usagef("--ui: %s", strings.TrimPrefix(err.Error(), ui.ErrInvalidConfig.Error()+": "))
		}
	}
	admin, err := deps.startAdminUI(listen, logger, dash, consistency)
	if err != nil {
		return err
	}
	eff := rl.Config()
	logger.Info("relay: started",
		"database", redactURL(conn.databaseURL), "redis", redactURL(conn.redisURL),
		"schema", eff.Schema, "prefix", conn.prefix, "queues", queuesOrAll(eff.Queues),
		"horizon", eff.Horizon.String(), "batch", eff.BatchSize, "admin", adminAddr(admin))

	runErr := rl.Run(ctx)
	if admin != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := admin.Shutdown(sctx); err != nil && runErr == nil {
			runErr = fmt.Errorf("admin server shutdown: %w", err)
		}
	}
	if runErr != nil {
		return runErr
	}
	logger.Info("relay: stopped")
	return nil
}

// offIfZero maps a flag's 0 ("off") to the Config's -1.
func offIfZero(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

func queuesOrAll(qs []string) string {
	if len(qs) == 0 {
		return "all"
	}
	return strings.Join(qs, ",")
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
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(m.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(m.Stderr, opts)), nil
	}
	return nil, usagef("--log-format %q: want text or json", format)
}
