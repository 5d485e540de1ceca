package securitytest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// FuzzConfigs drives every library Config with fuzzed values (clients on
// unreachable servers: nothing connects). Whatever the values: no panic; a
// refusal wraps the package's ErrInvalidConfig in one line; Validate and
// the constructor agree; an accepted configuration, with its defaults, keeps the
// documented bounds.
func FuzzConfigs(f *testing.F) {
	f.Add(int64(0), int64(0), int64(0), 0, 0, "", "")
	f.Add(int64(-1), int64(-1), int64(-1), -1, -1, "public", "delayq_outbox")
	f.Add(int64(time.Millisecond), int64(time.Second), int64(time.Hour), 10000, 10001, "Jobs", "dq:{x}")
	f.Add(int64(1), int64(2), int64(-2), 1, 1<<31, "a b", "\x00")
	pcfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		f.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(pool.Close)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	f.Cleanup(func() { _ = rdb.Close() })
	dq, err := dispatch.New(rdb, dispatch.Config{})
	if err != nil {
		f.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		f.Fatal(err)
	}
	refusal := func(t *testing.T, what string, err, sentinel error) {
		t.Helper()
		if !errors.Is(err, sentinel) || strings.ContainsAny(err.Error(), "\n\r") {
			t.Fatalf("%s: refusal %q does not wrap %v in one line", what, err, sentinel)
		}
	}
	f.Fuzz(func(t *testing.T, d1, d2, d3 int64, n1, n2 int, s1, s2 string) {
		a, b, c := time.Duration(d1), time.Duration(d2), time.Duration(d3)

		rc := relay.Config{Schema: s1, NotifyChannel: s2, Horizon: a, PollInterval: b, ReapInterval: c,
			Retention: c, BatchSize: n1, ReapBatch: n2, RetentionBatch: n2, BackoffMin: a, BackoffMax: b,
			StatsInterval: c, QueueRefresh: b, RoundTimeout: a, RetentionInterval: b, Queues: []string{s2},
			FollowUp: a, FollowUpFor: c}
		verr := rc.Validate()
		rl, nerr := relay.New(pool, dq.AsRedis(), rc)
		if (verr == nil) != (nerr == nil) {
			t.Fatalf("relay: Validate %v, New %v", verr, nerr)
		}
		if verr != nil {
			refusal(t, "relay", verr, relay.ErrInvalidConfig)
		} else {
			e := rl.Config()
			if e.BatchSize < 1 || e.BatchSize > 10000 || e.Horizon <= 0 || e.PollInterval <= 0 ||
				e.ReapInterval <= 0 && e.ReapInterval != -1 || e.Retention <= 0 && e.Retention != -1 || e.BackoffMax < e.BackoffMin ||
				e.FollowUp <= 0 || e.FollowUpFor <= 0 && e.FollowUpFor != -1 || e.FollowUpFor != -1 && e.FollowUp > e.FollowUpFor {
				t.Fatalf("relay accepted %+v", e)
			}
		}

		wc := delayq.WorkerConfig{Lease: a, HeartbeatInterval: b, ShutdownTimeout: c, OpTimeout: a, ErrorPause: b}
		verr = wc.Validate()
		w, nerr := clientkit.NewClient(pool, dq, ob, wc)
		if (verr == nil) != (nerr == nil) {
			t.Fatalf("worker: Validate %v, New %v", verr, nerr)
		}
		if verr != nil {
			refusal(t, "worker", verr, delayq.ErrInvalidConfig)
		} else {
			e := w.Config().Worker
			if e.Lease < time.Millisecond || e.HeartbeatInterval >= e.Lease || e.ShutdownTimeout < 0 && e.ShutdownTimeout != -1 {
				t.Fatalf("worker accepted %+v", e)
			}
			qc := delayq.QueueConfig{Concurrency: n1, MaxAttempts: n2, Backoff: delayq.Backoff{Base: b, Max: c}}
			verr = qc.Validate()
			herr := w.Handle("q", func(context.Context, *delayq.Task) error { return nil }, qc)
			if (verr == nil) != (herr == nil) {
				t.Fatalf("queue config: Validate %v, Handle %v", verr, herr)
			}
			if verr != nil {
				refusal(t, "queue config", verr, delayq.ErrInvalidConfig)
			} else if lo, hi := qc.Backoff.Bounds(n2); lo < 0 || hi < lo {
				t.Fatalf("backoff %+v: bounds %v..%v at attempt %d", qc.Backoff, lo, hi, n2)
			}
		}

		dc := dispatch.Config{Prefix: s1, DoneRetention: a, DefaultMaxAttempts: n1, MaxPayloadBytes: n2,
			EnqueueBatch: n1, ReapBackoffBase: b, ReapBackoffMax: c, MaxWait: a}
		if d, err := dispatch.New(rdb, dc); err != nil {
			refusal(t, "delayq", err, dispatch.ErrInvalidConfig)
		} else if e := d.Config(); e.MaxPayloadBytes < 1 || e.EnqueueBatch < 1 || e.EnqueueBatch > 10000 || e.ReapBackoffMax < e.ReapBackoffBase {
			t.Fatalf("delayq accepted %+v", e)
		}

		oc := outbox.Config{Schema: s1, NotifyChannel: s2, MaxPayloadBytes: n1, DefaultMaxAttempts: n2, NotifyWithin: a, NotifyCooldown: b}
		if o, err := outbox.New(oc); err != nil {
			refusal(t, "outbox", err, outbox.ErrInvalidConfig)
		} else if e := o.Config(); e.MaxPayloadBytes < -1 || e.DefaultMaxAttempts < 1 || !strings.HasPrefix(taskstate.New(taskstate.Config{Schema: e.Schema}).Table(), `"`) ||
			e.NotifyCooldown <= 0 && e.NotifyCooldown != -1 {
			t.Fatalf("outbox accepted %+v (schema %s)", e, e.Schema)
		}

		if err := (reconcile.Options{Schema: s1, BatchSize: n1}).Validate(); err != nil {
			refusal(t, "reconcile", err, reconcile.ErrInvalidOptions)
		}
	})
}
