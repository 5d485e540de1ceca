package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/delayq/delayq/internal/forecast"
	"github.com/delayq/delayq/internal/sidecar"
	"github.com/delayq/delayq/internal/ui"
	"github.com/delayq/delayq/relay"
)

// relayOptions is what 'delayq relay' was asked: the flags, and the library's
// config built from them.
type relayOptions struct {
	conn connFlags
	sidecarFlags
	horizon, pollInterval, reapInterval time.Duration
	retention, repairPause              time.Duration
	batch, repairRate                   int
	queues, schedules                   string
	pollOnly, withUI, uiReadOnly        bool
	forecastInterval                    time.Duration
	forecastParams                      forecast.Params

	relay    relay.Config
	ui       ui.Config       // with withUI
	forecast forecast.Config // with forecastInterval > 0 and an admin server
}

func (o *relayOptions) parse(m *Main, args []string) error {
	fs := newFlagSet(m, "relay", "relay [flags]",
		"  DATABASE_URL=postgres://app@db/app REDIS_URL=redis://cache:6379 delayq relay\n"+
			"  delayq relay --horizon 10m --listen :9090 --log-format json\n"+
			"  delayq relay --queues payment,mail          # only these queues (one relay per group)\n"+
			"  delayq relay --schedules schedules.yaml     # also enqueue periodic tasks (see delayq schedules --help)\n"+
			"  delayq relay --poll-only --poll-interval 1s # behind PgBouncer in transaction mode (no LISTEN)\n"+
			"  DELAYQ_UI_TOKEN=$(cat /run/secrets/ui) delayq relay --ui   # the dashboard too, on http://127.0.0.1:9090/ui/\n"+
			"  delayq relay --listen :9090 --forecast-handling-time 2s --forecast-concurrency 8  # KEDA: GET /forecast?queue=reports\n")
	o.conn.register(fs, m, true, true)
	def := relay.Config{}.WithDefaults() // the flags' defaults are the library's
	fs.DurationVar(&o.horizon, "horizon", def.Horizon, "move rows due within this time to Redis; later ones wait in PostgreSQL")
	fs.IntVar(&o.batch, "batch", def.BatchSize, "most rows one round moves (1..10000)")
	fs.DurationVar(&o.pollInterval, "poll-interval", def.PollInterval, "longest wait between rounds, the backstop for missed notifications")
	fs.BoolVar(&o.pollOnly, "poll-only", false, "poll instead of LISTEN, for PgBouncer in transaction mode: rows due sooner than --poll-interval after their commit reach Redis up to that late (add ?default_query_exec_mode=simple_protocol to the URL)")
	fs.DurationVar(&o.reapInterval, "reap-interval", def.ReapInterval, "how often expired leases are taken back; 0 turns the reaper off")
	fs.DurationVar(&o.retention, "retention", def.Retention, "delete done and cancelled rows this long after they finished; 0 keeps them")
	o.sidecarFlags.register(fs, sidecar.DefaultAddr, "address of /metrics, /healthz and /readyz (loopback by default; ':9090' for all interfaces; empty for none)")
	fs.StringVar(&o.queues, "queues", "", "comma-separated queues to relay and reap (default: all)")
	fs.IntVar(&o.repairRate, "repair-rate", def.RepairRate, "queued rows a second the self-healing pass compares with Redis; 0 turns self-healing (and Redis loss detection) off")
	fs.DurationVar(&o.repairPause, "repair-pause", def.RepairPause, "pause between two self-healing passes")
	fs.BoolVar(&o.withUI, "ui", false, "also serve the dashboard under /ui/ on the --listen address; its actions need "+uiTokenEnv+" or "+uiBasicEnv+" (or --ui-read-only)")
	fs.BoolVar(&o.uiReadOnly, "ui-read-only", false, "with --ui: serve the dashboard without any action")
	fs.DurationVar(&o.forecastInterval, "forecast-interval", forecast.DefaultInterval, "how often the autoscaling forecast (tasks due per minute for the next hour, the backlog) is read for /forecast and the delayq_forecast_* metrics; 0 turns it off")
	fs.DurationVar(&o.forecastParams.Lead, "forecast-lead", forecast.DefaultLead, "recommended workers: sized for the busiest minute this far ahead (1m..60m)")
	fs.DurationVar(&o.forecastParams.Handling, "forecast-handling-time", forecast.DefaultHandling, "recommended workers: mean time a worker spends on a task (1ms..1h)")
	fs.IntVar(&o.forecastParams.Concurrency, "forecast-concurrency", forecast.DefaultConcurrency, "recommended workers: tasks one worker runs at once (delayq worker --concurrency)")
	fs.StringVar(&o.schedules, "schedules", "", "YAML `file` of periodic tasks to enqueue, each tick once across relays (see delayq schedules --help)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("unexpected argument %q (see --help)", fs.Arg(0))
	}
	if err := o.validate(); err != nil {
		return err
	}
	return o.validateUI(m)
}

// validate checks the flags and builds the relay's config, checked by its own
// Validate.
func (o *relayOptions) validate() error {
	if o.repairRate < 0 {
		return usagef("--repair-rate %d: rows a second, 0 for off", o.repairRate)
	}
	o.relay = relay.Config{
		RepairRate:   o.repairRate,
		RepairPause:  o.repairPause,
		Schema:       o.conn.schema,
		Horizon:      o.horizon,
		BatchSize:    o.batch,
		PollInterval: o.pollInterval,
		PollOnly:     o.pollOnly,
		ReapInterval: offIfZero(o.reapInterval),
		Retention:    offIfZero(o.retention),
	}
	if o.repairRate == 0 {
		o.relay.RepairRate = -1
	}
	if o.schedules != "" {
		var err error
		if o.relay.Schedules, err = loadSchedules(o.schedules); err != nil {
			return usagef("--schedules: %v", err)
		}
	}
	for q := range strings.SplitSeq(o.queues, ",") {
		if q = strings.TrimSpace(q); q != "" {
			o.relay.Queues = append(o.relay.Queues, q)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"horizon", o.horizon}, {"poll-interval", o.pollInterval}, {"reap-interval", o.reapInterval}, {"retention", o.retention}} {
		if d.v < 0 || d.v == 0 && (d.name == "horizon" || d.name == "poll-interval") {
			return usagef("--%s %v: must be positive", d.name, d.v)
		}
	}
	if o.batch < 1 || o.batch > 10000 {
		return usagef("--batch %d: 1..10000", o.batch)
	}
	if err := o.relay.Validate(); err != nil {
		return usagef("%s", libraryMessage(err, relay.ErrInvalidConfig))
	}
	return o.validateForecast()
}

// validateForecast checks the forecast's flags (each by its name) and builds its
// config.
func (o *relayOptions) validateForecast() error {
	p := o.forecastParams
	switch {
	case o.forecastInterval < 0 || o.forecastInterval > 0 && o.forecastInterval < time.Second:
		return usagef("--forecast-interval %v: at least 1s, or 0 for off", o.forecastInterval)
	case p.Lead < time.Minute || p.Lead > forecast.Minutes*time.Minute:
		return usagef("--forecast-lead %v: 1m..60m", p.Lead)
	case p.Handling < time.Millisecond || p.Handling > forecast.MaxHandling:
		return usagef("--forecast-handling-time %v: 1ms..1h", p.Handling)
	case p.Concurrency < 1 || p.Concurrency > forecast.MaxConcurrency:
		return usagef("--forecast-concurrency %d: 1..%d", p.Concurrency, forecast.MaxConcurrency)
	}
	o.forecast = forecast.Config{Schema: o.relay.Schema, Queues: o.relay.Queues, Interval: o.forecastInterval, Params: p}
	if err := o.forecast.Validate(); err != nil {
		return usagef("%s", libraryMessage(err, forecast.ErrInvalidConfig))
	}
	return nil
}

// validateUI reads the dashboard's credentials: secure by default, as delayq
// ui, from the environment, else no dashboard (a relay prints no token to its
// logs).
func (o *relayOptions) validateUI(m *Main) error {
	if !o.withUI {
		if o.uiReadOnly {
			return usagef("--ui-read-only: only with --ui")
		}
		return nil
	}
	if o.listen == "" {
		return usagef("--ui: serves on the --listen address, which is empty")
	}
	var err error
	if o.ui, err = uiCredentials(m.Getenv(uiTokenEnv), m.Getenv(uiBasicEnv), o.uiReadOnly); err != nil {
		return err
	}
	if !o.uiReadOnly && o.ui.Token == "" && o.ui.BasicUser == "" {
		return usagef("--ui: actions need %s or %s in the environment (or --ui-read-only)", uiTokenEnv, uiBasicEnv)
	}
	return nil
}

// runRelay runs relay.New, not the client: the sidecar runs the relay alone,
// with its readiness (Repairing) and the dashboard on its admin server.
func runRelay(ctx context.Context, m *Main, args []string) error {
	var o relayOptions
	if err := o.parse(m, args); err != nil {
		return err
	}
	logger, deps, err := o.sidecarFlags.open(ctx, m, &o.conn)
	if err != nil {
		return err
	}
	defer deps.close()
	cfg := o.relay
	cfg.Logger, cfg.Registerer = logger, deps.reg
	cfg.Prefix, cfg.Database = o.conn.prefix, o.conn.database
	rl, err := relay.New(deps.pool, deps.dq.AsRedis(), cfg)
	if err != nil {
		return err
	}
	// A schema never migrated: stop before serving /readyz (Run would too).
	if ob, err := newOutbox(o.conn.schema); err != nil {
		return err
	} else if err := ob.CheckMigrated(ctx, deps.pool); err != nil {
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
	if o.withUI {
		ob, err := newOutbox(o.conn.schema)
		if err != nil {
			return err
		}
		uiCfg := o.ui
		uiCfg.DB, uiCfg.Redis, uiCfg.Outbox, uiCfg.BasePath, uiCfg.Logger = deps.pool, deps.dq, ob, sidecar.UIPath, logger
		if dash, err = ui.New(uiCfg); err != nil {
			return usagef("--ui: %s", libraryMessage(err, ui.ErrInvalidConfig))
		}
	}
	// The forecast serves /forecast and its metrics from the admin server: with
	// none, nobody reads it and it does not run.
	var fc *forecast.Forecaster
	endpoints := map[string]http.Handler{}
	if o.forecastInterval > 0 && o.listen != "" {
		fcfg := o.forecast
		fcfg.Logger, fcfg.Registerer = logger, deps.registerer(o.conn.database)
		if fc, err = forecast.New(deps.pool, deps.dq, fcfg); err != nil {
			return err
		}
		endpoints[forecast.Path] = fc.Handler()
	}
	admin, err := deps.startAdminWith(o.listen, logger, dash, endpoints, consistency)
	if err != nil {
		return err
	}
	eff := rl.Config()
	logger.Info("relay: started",
		"database", redactURL(o.conn.databaseURL), "redis", redactURL(o.conn.redisURL),
		"schema", eff.Schema, "prefix", o.conn.namespace(), "queues", queuesOrAll(eff.Queues),
		"horizon", eff.Horizon.String(), "batch", eff.BatchSize, "admin", adminAddr(admin), "forecast", forecastState(fc))
	runCtx, stop := context.WithCancel(ctx)
	var forecasting sync.WaitGroup
	if fc != nil {
		forecasting.Go(func() { _ = fc.Run(runCtx) }) // returns nil when runCtx ends
	}
	runErr := rl.Run(runCtx)
	stop()
	forecasting.Wait()
	if err := stopAdmin(ctx, admin, runErr); err != nil {
		return err
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

// forecastState is the start line's word on the forecast.
func forecastState(fc *forecast.Forecaster) string {
	if fc == nil {
		return "off"
	}
	c := fc.Config()
	return fmt.Sprintf("every %v, lead %v, handling %v, concurrency %d", c.Interval, c.Params.Lead, c.Params.Handling, c.Params.Concurrency)
}
