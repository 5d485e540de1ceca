package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/ui"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/migrations"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// Environment variables of delayq ui's credentials (flags are visible to every
// user of the machine in the process list; the environment is not).
const (
	uiTokenEnv = "DELAYQ_UI_TOKEN"
	uiBasicEnv = "DELAYQ_UI_BASIC_AUTH"
)

func runUI(ctx context.Context, m *Main, args []string) error {
	var conn connFlags
	fs := newFlagSet(m, "ui", "ui [flags]",
		"  delayq ui                                  # http://127.0.0.1:8080, a token printed at start\n"+
			"  DELAYQ_UI_TOKEN=$(cat /run/secrets/ui) delayq ui --listen 10.0.0.5:8080\n"+
			"  delayq ui --read-only --hide-payloads      # look, never act, never show a payload\n"+
			"  go run -tags delayqdev ./cmd/delayq ui --demo   # throwaway servers and a live workload to watch\n"+
			"  delayq ui --database eu1=postgres://db-eu1/app --database us1=postgres://db-us1/app\n"+
			"                                             # several outbox databases: an overview of each and the total,\n"+
			"                                             # each database's own dashboard at /db/KEY/\n\n"+
			"Every action (cancel, reschedule, run now, retry, purge, check) needs the token (typed\n"+
			"into the login page, or sent as Authorization: Bearer) or the basic credentials, and\n"+
			"a CSRF token; --read-only serves none. See docs/SECURITY.md, \"The dashboard\".\n")
	conn.register(fs, m, true, true)
	listen := fs.String("listen", "127.0.0.1:8080", "address to serve on (loopback by default; ':8080' for every interface)")
	token := fs.String("token", m.Getenv(uiTokenEnv), "token for actions, at least 16 bytes (env "+uiTokenEnv+"; default: a random one, printed)")
	basic := fs.String("basic-auth", m.Getenv(uiBasicEnv), "user:password for actions with HTTP basic auth (env "+uiBasicEnv+")")
	readOnly := fs.Bool("read-only", false, "serve the pages without any action")
	hide := fs.Bool("hide-payloads", false, "never show a payload")
	authReads := fs.Bool("auth-reads", false, "ask for the credentials on every page, not only for actions")
	refresh := fs.Duration("refresh", 0, "reload the queues page this often (0: never)")
	demoMode := fs.Bool("demo", false, "run a live demo workload (relay, workers, orders, some dying) in a schema and key prefix of its own, and show it")
	var databases databaseFlags
	registerDatabases(fs, &databases)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	dbs, err := resolveDatabases(fs, &databases)
	if err != nil {
		return err
	}
	if *demoMode && len(dbs) > 0 {
		return usagef("--demo runs a database of its own: drop --database")
	}
	cfg, err := uiCredentials(*token, *basic, *readOnly)
	if err != nil {
		return err
	}
	cfg.HidePayloads, cfg.AuthReads, cfg.Refresh = *hide, *authReads, *refresh
	printToken := false
	if !*readOnly && cfg.Token == "" && cfg.BasicUser == "" {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		cfg.Token, printToken = hex.EncodeToString(b), true
	}
	if *demoMode {
		if cfg.Refresh == 0 {
			cfg.Refresh = 2 * time.Second
		}
		if err := conn.checkURLs(); err != nil {
			return err
		}
		stop, err := m.throwawayServers(ctx, &conn, false)
		defer stop()
		if err != nil {
			return err
		}
	}
	if len(dbs) > 0 {
		h, closeAll, err := uiOfDatabases(ctx, &conn, dbs, cfg)
		if err != nil {
			return err
		}
		defer closeAll()
		keys := make([]string, len(dbs))
		for i, d := range dbs {
			keys[i] = d.key
		}
		return serveUI(ctx, m, h, *listen, fmt.Sprintf("schema %s, prefix %s, databases %s", conn.schema, conn.prefix, strings.Join(keys, ", ")),
			printToken, cfg.Token, *readOnly)
	}
	pool, err := conn.openPostgres(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	rdb, err := conn.openRedis(ctx)
	if err != nil {
		return err
	}
	defer rdb.Close()
	schema, prefix := conn.schema, conn.namespace()
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var wg sync.WaitGroup
	defer wg.Wait()
	if *demoMode {
		suffix := fmt.Sprintf("%d", time.Now().UnixNano()%1e6)
		schema, prefix = "delayq_ui_demo_"+suffix, "dquidemo."+suffix
		defer cleanupDemo(pool, rdb, schema, prefix)
	}
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix, ReapBackoffBase: 100 * time.Millisecond})
	if err != nil {
		return usagef("%v", err)
	}
	ob, err := outbox.New(outbox.Config{Schema: schema})
	if err != nil {
		return usagef("%v", err)
	}
	if *demoMode {
		if err := startDemoWorkload(runCtx, &wg, pool, dq, ob, schema); err != nil {
			return err
		}
	}
	cfg.DB, cfg.Redis, cfg.Outbox = pool, dq, ob
	h, err := ui.New(cfg)
	if err != nil {
		return usagef("%s", strings.TrimPrefix(err.Error(), ui.ErrInvalidConfig.Error()+": "))
	}
	return serveUI(ctx, m, h, *listen, fmt.Sprintf("schema %s, prefix %s", schema, prefix), printToken, cfg.Token, *readOnly)
}

// uiOfDatabases builds the dashboard over several databases (--database): one
// Redis client, a pool per database, each database's keys under PREFIX:KEY.
// Everything is checked before anything connects; closeAll closes what was
// opened.
func uiOfDatabases(ctx context.Context, conn *connFlags, dbs []namedDatabase, cfg ui.Config) (h http.Handler, closeAll func(), err error) {
	var closers []func()
	closeOpened := func() {
		for _, c := range closers {
			c()
		}
	}
	defer func() {
		if err != nil {
			closeOpened()
		}
	}()
	if err := validate.Prefix(conn.prefix); err != nil {
		return nil, nil, usagef("--prefix: %v", err)
	}
	if err := conn.checkRedis(); err != nil {
		return nil, nil, err
	}
	ob, err := outbox.New(outbox.Config{Schema: conn.schema})
	if err != nil {
		return nil, nil, usagef("%v", err)
	}
	rdb, err := conn.openRedis(ctx)
	if err != nil {
		return nil, nil, err
	}
	closers = append(closers, func() { _ = rdb.Close() })
	uidbs := make([]ui.Database, len(dbs))
	for i, d := range dbs {
		c := *conn
		c.databaseURL = d.url
		pool, err := c.openPostgres(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("database %s: %w", d.key, err)
		}
		closers = append(closers, pool.Close)
		dq, err := dispatch.New(rdb, dispatch.Config{Prefix: dispatch.Namespace(conn.prefix, d.key)})
		if err != nil {
			return nil, nil, usagef("database %s: %v", d.key, err)
		}
		uidbs[i] = ui.Database{Key: d.key, DB: pool, Redis: dq, Outbox: ob}
	}
	mh, err := ui.NewMulti(uidbs, cfg)
	if err != nil {
		return nil, nil, usagef("%s", strings.TrimPrefix(err.Error(), ui.ErrInvalidConfig.Error()+": "))
	}
	return mh, closeOpened, nil
}

// serveUI serves h on listen until ctx ends, saying where (and what: desc).
func serveUI(ctx context.Context, m *Main, h http.Handler, listen, desc string, printToken bool, token string, readOnly bool) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	fmt.Fprintf(m.Stdout, "delayq ui: serving http://%s/ (%s)\n", ln.Addr(), desc)
	if printToken {
		fmt.Fprintf(m.Stdout, "delayq ui: token for actions (log in at http://%s/login): %s\n", ln.Addr(), token)
	}
	if readOnly {
		fmt.Fprintln(m.Stdout, "delayq ui: read-only: no action is served")
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// startDemoWorkload migrates the demo's schema and runs, until ctx ends, a relay,
// workers and a producer: orders charged a few seconds after they are placed,
// one in ten failing once, one in fifty dying (for the dead letters), and emails.
func startDemoWorkload(ctx context.Context, wg *sync.WaitGroup, pool *pgxpool.Pool, dq *dispatch.Client, ob *outbox.Client, schema string) error {
	db := migrations.OpenDBFromPool(pool)
	_, err := migrations.Up(ctx, db, migrations.Config{Schema: schema})
	db.Close()
	if err != nil {
		return fmt.Errorf("demo: migrate: %w", err)
	}
	rl, err := relay.New(pool, dq.AsRedis(), relay.Config{Schema: schema, ReapInterval: 200 * time.Millisecond})
	if err != nil {
		return err
	}
	w, err := clientkit.NewClient(pool, dq, ob, delayq.WorkerConfig{Lease: 5 * time.Second})
	if err != nil {
		return err
	}
	handle := func(ctx context.Context, t *delayq.Task) error {
		select { // the work takes a while, so some tasks are seen active
		case <-time.After(time.Duration(50+mathrand.IntN(400)) * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		switch p := string(t.Payload); {
		case strings.Contains(p, `"doomed"`):
			return delayq.NoRetry(errors.New("card declined: insufficient funds (demo)"))
		case strings.Contains(p, `"flaky"`) && t.Attempt == 1:
			return errors.New("payment gateway timeout (demo: retried)")
		}
		return nil
	}
	qcfg := delayq.QueueConfig{Concurrency: 8, Backoff: delayq.Backoff{Base: time.Second, Max: 5 * time.Second}}
	for _, q := range []string{"charge", "email"} {
		if err := w.Handle(q, handle, qcfg); err != nil {
			return err
		}
	}
	wg.Go(func() { _ = rl.Run(ctx) })
	wg.Go(func() { _ = w.Run(ctx) })
	wg.Go(func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for n := 1; ; n++ {
			var tasks []outbox.Task
			for i := range 8 {
				id := fmt.Sprintf("order-%d-%d", n, i)
				kind := "normal"
				switch r := mathrand.IntN(100); {
				case r < 3:
					kind = "doomed"
				case r < 13:
					kind = "flaky"
				}
				payload := fmt.Sprintf(`{"order_id":%q,"amount_cents":%d,"kind":%q}`, id, 100+mathrand.IntN(9900), kind)
				tasks = append(tasks,
					outbox.Task{Queue: "charge", ID: id, Payload: []byte(payload), Delay: time.Duration(mathrand.IntN(20000)) * time.Millisecond},
					outbox.Task{Queue: "email", ID: id + ":receipt", Payload: []byte(`{"order_id":"` + id + `"}`), Delay: time.Duration(5000+mathrand.IntN(60000)) * time.Millisecond})
			}
			_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := ob.EnqueueMany(ctx, tx, tasks)
				return err
			})
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	return nil
}

// cleanupDemo removes the demo's schema and keys (as delayq demo does).
func cleanupDemo(pool *pgxpool.Pool, rdb redis.UniversalClient, schema, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	del := func(ctx context.Context, node redis.Cmdable) error {
		iter := node.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		for _, k := range keys { // one by one: in a Cluster, keys of many slots
			node.Unlink(ctx, k)
		}
		return iter.Err()
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return del(ctx, n) })
		return
	}
	_ = del(ctx, rdb)
}

// uiCredentials reads the dashboard's credentials: a token (at least 16 bytes) and
// basic credentials as user:password, either or both empty.
func uiCredentials(token, basic string, readOnly bool) (ui.Config, error) {
	cfg := ui.Config{Token: token, ReadOnly: readOnly}
	if basic != "" {
		u, p, ok := strings.Cut(basic, ":")
		if !ok || u == "" || p == "" {
			return cfg, usagef("basic credentials (--basic-auth, %s): want user:password", uiBasicEnv)
		}
		cfg.BasicUser, cfg.BasicPassword = u, p
	}
	if token != "" && len(token) < 16 {
		return cfg, usagef("token (--token, %s): at least 16 bytes", uiTokenEnv)
	}
	return cfg, nil
}
