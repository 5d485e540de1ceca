package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/sqlapi"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// TestLimitsAgree crosses every limit of a task (queue name, id, payload bytes,
// attempts, error text: one set, in internal/validate) on every path: the library
// (pgx, one task and many), database/sql, the SQL API's functions (one task and
// many: their SQLSTATE stands for the same sentinel), the CLI, then the relay and the Redis
// scripts. Whatever a producer path accepts, the relay moves and Redis holds, byte
// for byte; whatever one refuses, every one refuses with the same sentinel and
// writes nothing.
func TestLimitsAgree(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	unlimited, err := outbox.New(outbox.Config{MaxPayloadBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	std, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(b.pool)
	t.Cleanup(func() { db.Close() })

	type limitCase struct {
		name        string
		queue, id   string // "%s" in either is replaced by the path's three-letter name
		payload     int
		maxAttempts int
		ob          *outbox.Client
		want        error // nil: accepted everywhere
		cli         bool  // also through the CLI (its outbox has the default limits)
	}
	cases := []limitCase{
		{name: "queue at 64 bytes", queue: "%s" + strings.Repeat("q", 64-3), id: "a", ob: std, cli: true},
		{name: "queue of 65 bytes", queue: "%s" + strings.Repeat("q", 65-3), id: "a", ob: std, want: validate.ErrInvalidQueue, cli: true},
		{name: "queue with a space", queue: "%s q", id: "a", ob: std, want: validate.ErrInvalidQueue, cli: true},
		{name: "id at 200 bytes", queue: "ids", id: "%s" + strings.Repeat("i", 200-3), ob: std, cli: true},
		{name: "id of 201 bytes", queue: "ids", id: "%s" + strings.Repeat("i", 201-3), ob: std, want: validate.ErrInvalidTaskID, cli: true},
		{name: "id with a brace", queue: "ids", id: "%s{x}", ob: std, want: validate.ErrInvalidTaskID, cli: true},
		{name: "payload at the default limit", queue: "pay", id: "%s-64k", payload: validate.DefaultMaxPayloadBytes, ob: std, cli: true},
		{name: "payload over the default limit", queue: "pay", id: "%s-64k1", payload: validate.DefaultMaxPayloadBytes + 1, ob: std, want: outbox.ErrPayloadTooLarge, cli: true},
		{name: "payload of 100 KiB, no limit of the producer's", queue: "pay", id: "%s-100k", payload: 100 << 10, ob: unlimited},
		{name: "payload at the hard limit", queue: "pay", id: "%s-16m", payload: validate.MaxPayloadBytes, ob: unlimited},
		{name: "payload over the hard limit", queue: "pay", id: "%s-16m1", payload: validate.MaxPayloadBytes + 1, ob: unlimited, want: outbox.ErrPayloadTooLarge},
		{name: "max attempts at the limit", queue: "att", id: "%s-1m", maxAttempts: validate.MaxAttempts, ob: std, cli: true},
		{name: "max attempts over the limit", queue: "att", id: "%s-1m1", maxAttempts: validate.MaxAttempts + 1, ob: std, want: validate.ErrInvalidMaxAttempts, cli: true},
		{name: "max attempts 2,000,000", queue: "att", id: "%s-2m", maxAttempts: 2_000_000, ob: std, want: validate.ErrInvalidMaxAttempts, cli: true},
	}
	paths := []struct {
		name    string
		enqueue func(ob *outbox.Client, task outbox.Task) error
	}{
		{"pgx", func(ob *outbox.Client, task outbox.Task) error { _, err := ob.Enqueue(ctx, b.pool, task); return err }},
		{"sql", func(ob *outbox.Client, task outbox.Task) error { _, err := ob.EnqueueSQL(ctx, db, task); return err }},
		{"mny", func(ob *outbox.Client, task outbox.Task) error {
			_, err := ob.EnqueueMany(ctx, b.pool, []outbox.Task{task})
			return err
		}},
		{"fun", func(ob *outbox.Client, task outbox.Task) error { return viaSQL(ctx, b.pool, ob, task, false) }},
		{"fnm", func(ob *outbox.Client, task outbox.Task) error { return viaSQL(ctx, b.pool, ob, task, true) }},
		{"cli", nil},
	}
	type accepted struct {
		queue, id   string
		payload     []byte
		maxAttempts int
	}
	var moved []accepted
	dir := t.TempDir()
	for _, c := range cases {
		if testing.Short() && c.payload > validate.DefaultMaxPayloadBytes<<4 {
			continue // 16 MiB through every path, with -race: left to make test
		}
		for _, p := range paths {
			if p.enqueue == nil && !c.cli {
				continue
			}
			queue, id := strings.ReplaceAll(c.queue, "%s", p.name), strings.ReplaceAll(c.id, "%s", p.name)
			payload := bytes.Repeat([]byte{'p'}, c.payload)
			task := outbox.Task{Queue: queue, ID: id, Payload: payload, MaxAttempts: c.maxAttempts}
			var err error
			if p.enqueue != nil {
				err = p.enqueue(c.ob, task)
				if c.want != nil && !errors.Is(err, c.want) || c.want == nil && err != nil {
					t.Errorf("%s, %s: %v, want %v", c.name, p.name, err, c.want)
				}
			} else {
				file := filepath.Join(dir, "payload")
				if err := os.WriteFile(file, payload, 0o600); err != nil {
					t.Fatal(err)
				}
				args := []string{"enqueue", "--queue", queue, "--id", id, "--payload-file", file}
				if c.maxAttempts != 0 {
					args = append(args, "--max-attempts", strconv.Itoa(c.maxAttempts))
				}
				r := b.run(t, args...)
				if code := map[bool]int{true: exitOK, false: exitUsage}[c.want == nil]; r.code != code {
					t.Errorf("%s, cli: exit %d, want %d: %s", c.name, r.code, code, r.stderr)
				}
			}
			var rows int
			if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE queue = $1 AND task_id = $2`, queue, id).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{true: 1, false: 0}[c.want == nil]; rows != want {
				t.Errorf("%s, %s: %d rows, want %d", c.name, p.name, rows, want)
			}
			if c.want == nil {
				maxAtt := c.maxAttempts
				if maxAtt == 0 {
					maxAtt = validate.DefaultMaxAttempts
				}
				moved = append(moved, accepted{queue, id, payload, maxAtt})
			}
		}
	}

	// The relay moves every accepted row, whatever the Redis client's own payload
	// limit (its default, 64 KiB, here). Three 16 MiB payloads cross Redis in one
	// round: the only clock is the test's deadline, not go-redis's 3 s socket
	// deadlines or the relay's 30 s round, which a loaded machine can outlast
	// (a round that times out is retried whole, and may time out again).
	opt, err := redis.ParseURL(b.env["REDIS_URL"])
	if err != nil {
		t.Fatal(err)
	}
	opt.ReadTimeout, opt.WriteTimeout, opt.ContextTimeoutEnabled = -1, -1, true
	patient := redis.NewClient(opt)
	t.Cleanup(func() { _ = patient.Close() })
	if b.dq, err = dispatch.New(patient, dispatch.Config{Prefix: b.prefix}); err != nil {
		t.Fatal(err)
	}
	rl, err := relay.New(b.pool, b.dq.AsRedis(), relay.Config{Registerer: prometheus.NewRegistry(), RoundTimeout: 2 * time.Minute,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- rl.Run(rctx) }()
	for pending := -1; pending != 0; {
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE state = 'pending'`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d rows still pending", pending)
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	for _, a := range moved {
		ti, err := b.dq.Inspect(ctx, a.queue, a.id)
		if err != nil {
			t.Fatal(err)
		}
		if ti[0].State != dispatch.StateReady || !bytes.Equal(ti[0].Payload, a.payload) || ti[0].MaxAttempts != a.maxAttempts {
			t.Errorf("%s/%.20s… in Redis: %s, %d payload bytes, max attempts %d; want ready, %d, %d",
				a.queue, a.id, ti[0].State, len(ti[0].Payload), ti[0].MaxAttempts, len(a.payload), a.maxAttempts)
		}
	}
	var dead int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE state <> 'queued'`).Scan(&dead); err != nil || dead != 0 {
		t.Errorf("%d rows not queued (%v): the relay refused what the outbox accepted", dead, err)
	}

	// Error text: a failure's summary fits both stores.
	long := strings.Repeat("é", 3000)
	store := taskstate.New(taskstate.Config{Schema: taskstate.DefaultSchema})
	a := moved[0]
	ok, err := store.RecordFailure(ctx, b.pool, taskstate.Failure{
		Key: taskstate.Key{Queue: a.queue, ID: a.id, Version: 1}, Attempt: 1, Err: long, Delay: time.Second,
	})
	if err != nil || !ok {
		t.Fatalf("record failure: %v %v", ok, err)
	}
	var stored string
	if err := b.pool.QueryRow(ctx, `SELECT last_error FROM delayq_outbox WHERE queue = $1 AND task_id = $2`, a.queue, a.id).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if len(stored) > validate.MaxErrorBytes || stored != validate.ErrorSummary(long) {
		t.Errorf("stored error of %d bytes, want the %d-byte summary", len(stored), validate.MaxErrorBytes)
	}
	cl, err := b.dq.Claim(ctx, a.queue, 1, time.Minute)
	if err != nil || len(cl.Tasks) != 1 {
		t.Fatalf("claim %s: %+v %v", a.queue, cl, err)
	}
	if _, err := b.dq.Retry(ctx, a.queue, cl.Tasks[0].ID, cl.Tasks[0].Token, time.Second, stored); err != nil {
		t.Errorf("Redis refuses the summary Postgres stored: %v", err)
	}
}

// viaSQL enqueues task with the SQL API's functions (delayq_enqueue, or
// delayq_enqueue_many when many) in a transaction whose delayq.max_payload_bytes is
// ob's.
func viaSQL(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Client, task outbox.Task, many bool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		limit := strconv.Itoa(ob.Config().MaxPayloadBytes)
		if _, err := tx.Exec(ctx, `SELECT set_config('delayq.max_payload_bytes', $1, true)`, limit); err != nil {
			return err
		}
		api := sqlapi.New("")
		if many {
			_, err := api.EnqueueMany(ctx, tx, []outbox.Task{task})
			return err
		}
		_, err := api.Enqueue(ctx, tx, task)
		return err
	})
}
