package securitytest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// leastRole creates a PostgreSQL role that may only read and write the outbox
// table (SELECT, INSERT, UPDATE, DELETE), and returns url logged in as it.
func leastRole(t *testing.T, ctx context.Context, dbURL string) string {
	t.Helper()
	role := fmt.Sprintf("sec_rw_%d", os.Getpid())
	admin := testenv.Pool(t, dbURL)
	for _, sql := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"REVOKE ALL ON SCHEMA public FROM PUBLIC",
		"GRANT USAGE ON SCHEMA public TO " + role,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON delayq_outbox TO " + role,
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = admin.Exec(ctx, "REVOKE ALL ON delayq_outbox FROM "+role)
		_, _ = admin.Exec(ctx, "REVOKE ALL ON SCHEMA public FROM "+role)
		_, _ = admin.Exec(ctx, "DROP ROLE IF EXISTS "+role)
	})
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return u.String()
}

// TestPayloadLifetime follows payloads, which may hold personal data, through
// both stores, with the producer, the relay (retention included) and the worker
// logged in as a role holding only SELECT, INSERT, UPDATE and DELETE on the outbox:
// Redis drops the whole task at completion; PostgreSQL keeps the payload until retention
// deletes the row, unless the queue clears it when done (QueueConfig.ClearPayload)
// or the outbox client that marks it done or cancels it has ClearPayloadOnDone; a dead
// task keeps its payload in both stores.
func TestPayloadLifetime(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t, 2*time.Minute)
	adminURL := testenv.PostgresURL(t)
	roleURL := leastRole(t, ctx, adminURL)
	admin := testenv.Pool(t, adminURL)
	pool := testenv.Pool(t, roleURL)
	rdb, prefix := testenv.Redis(t)
	dq, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	ob, _ := outbox.New(outbox.Config{})
	clearing, _ := outbox.New(outbox.Config{ClearPayloadOnDone: true})
	secret := func(id string) []byte { return []byte(`{"email":"` + id + `@example.com"}`) }
	for _, x := range []struct {
		ob    *outbox.Client
		queue string
		id    string
		delay time.Duration
	}{
		{ob, "keep", "k-1", 0}, {ob, "clear", "c-1", 0}, {ob, "doomed", "d-1", 0},
		{ob, "keep2", "k-2", 0}, {clearing, "keep", "cancelled", time.Hour},
	} {
		if _, err := x.ob.Enqueue(ctx, pool, outbox.Task{Queue: x.queue, ID: x.id, Payload: secret(x.id), Delay: x.delay}); err != nil {
			t.Fatal(err)
		}
	}
	if err := clearing.Cancel(ctx, pool, "keep", "cancelled"); err != nil {
		t.Fatal(err)
	}
	pgPayload := func(id string) (state string, payload []byte) {
		t.Helper()
		err := admin.QueryRow(ctx, `SELECT state, payload FROM delayq_outbox WHERE task_id = $1`, id).Scan(&state, &payload)
		if errors.Is(err, pgx.ErrNoRows) {
			return "deleted", nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return state, payload
	}

	rl, err := relay.New(pool, dq.AsRedis(), relay.Config{PollInterval: 100 * time.Millisecond, Retention: -1, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := clientkit.NewClient(pool, dq, ob, delayq.WorkerConfig{Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	// A worker whose outbox client clears payloads of every task it marks done.
	w2, err := clientkit.NewClient(pool, dq, clearing, delayq.WorkerConfig{Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	ok := func(context.Context, *delayq.Task) error { runs.Add(1); return nil }
	if err := w.Handle("keep", ok, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := w2.Handle("keep2", ok, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := w.Handle("clear", ok, delayq.QueueConfig{ClearPayload: true}); err != nil {
		t.Fatal(err)
	}
	if err := w.Handle("doomed", func(context.Context, *delayq.Task) error {
		return delayq.NoRetry(errors.New("refused"))
	}, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	errs := make(chan error, 3)
	go func() { errs <- rl.Run(runCtx) }()
	go func() { errs <- w.Run(runCtx) }()
	go func() { errs <- w2.Run(runCtx) }()
	waitFor(t, 30*time.Second, "the tasks to finish", func() bool {
		a, _ := pgPayload("k-1")
		b, _ := pgPayload("k-2")
		c, _ := pgPayload("c-1")
		d, _ := pgPayload("d-1")
		return a == "done" && b == "done" && c == "done" && d == "dead"
	})
	stop()
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatalf("Run as the least-privilege role: %v", err)
		}
	}

	for _, c := range []struct {
		id, state string
		kept      bool
	}{
		{"k-1", "done", true},             // nothing asked to clear it: until retention
		{"k-2", "done", false},            // outbox ClearPayloadOnDone
		{"c-1", "done", false},            // worker QueueConfig.ClearPayload
		{"cancelled", "cancelled", false}, // outbox ClearPayloadOnDone, on cancel
		{"d-1", "dead", true},             // dead: kept for a person to retry
	} {
		st, p := pgPayload(c.id)
		if st != c.state || (len(p) > 0) != c.kept || c.kept && string(p) != string(secret(c.id)) {
			t.Errorf("%s in PostgreSQL: %s with payload %q; want %s, payload kept: %v", c.id, st, p, c.state, c.kept)
		}
	}
	for _, c := range []struct {
		queue, id string
		state     dispatch.State
		kept      bool
	}{{"keep", "k-1", dispatch.StateMissing, false}, {"clear", "c-1", dispatch.StateMissing, false}, {"doomed", "d-1", dispatch.StateDead, true}} {
		info, err := dq.Inspect(ctx, c.queue, c.id)
		if err != nil {
			t.Fatal(err)
		}
		if info[0].State != c.state || (info[0].Payload != nil) != c.kept {
			t.Errorf("%s in Redis: %s with payload %q; want %s, payload kept: %v", c.id, info[0].State, info[0].Payload, c.state, c.kept)
		}
	}

	// Retention, as the same role: done and cancelled rows go, the dead one stays.
	rl2, err := relay.New(pool, dq.AsRedis(), relay.Config{Retention: time.Millisecond, RetentionInterval: 50 * time.Millisecond,
		PollInterval: time.Second, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop = context.WithCancel(ctx)
	go func() { errs <- rl2.Run(runCtx) }()
	waitFor(t, 30*time.Second, "retention to delete the finished rows", func() bool {
		for _, id := range []string{"k-1", "k-2", "c-1", "cancelled"} {
			if st, _ := pgPayload(id); st != "deleted" {
				return false
			}
		}
		return true
	})
	stop()
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if st, p := pgPayload("d-1"); st != "dead" || len(p) == 0 {
		t.Errorf("dead row after retention: %s, payload %q", st, p)
	}
}
