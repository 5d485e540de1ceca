package delayq_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

type payment struct{ Order string }

var payments = outbox.Queue[payment]{Name: "payments"}

// The whole flow on one client, in a schema of its own: migrate an empty
// database, enqueue in a business transaction (a rolled-back one enqueues
// nothing), run the handler and the in-process relay, and shut down.
func TestClientFlow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t, testenv.EmptyPostgresURL(t))
	rdb, prefix := testenv.Redis(t)
	client, err := delayq.New(pool, rdb, delayq.Config{Schema: "shop", Prefix: prefix,
		Relay: &relay.Config{PollInterval: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (order_id text)`); err != nil {
		t.Fatal(err)
	}
	ran := make(chan string, 10)
	err = delayq.RegisterTx(client, payments, func(ctx context.Context, tx pgx.Tx, tk *delayq.Task, p payment) error {
		_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1)`, p.Order)
		ran <- p.Order
		return err
	}, delayq.QueueConfig{})
	if err != nil {
		t.Fatal(err)
	}
	enqueue := func(id string, commit bool) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := payments.Enqueue(ctx, client, tx, outbox.Task{ID: id}, payment{Order: id}); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	enqueue("rolled-back", false)
	enqueue("o-1", true)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- client.Run(runCtx) }()
	select {
	case got := <-ran:
		if got != "o-1" {
			t.Fatalf("ran %q, want o-1", got)
		}
	case err := <-done:
		t.Fatalf("Run returned before the task ran: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the task did not run within 30s")
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run after shutdown: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("ledger rows %d (%v), want 1", n, err)
	}
	stats, err := client.Stats(ctx, payments.Name)
	if err != nil || len(stats) != 1 || stats[0].Postgres[delayqtype.StateDone] != 1 {
		t.Fatalf("stats %+v (%v), want one done task", stats, err)
	}
}

// The operator's calls reach both stores through the client.
func TestClientAdmin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	rdb, prefix := testenv.Redis(t)
	client, err := delayq.New(pool, rdb, delayq.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	// A queue with no task yet can be paused.
	ctl, err := client.Pause(ctx, "empty")
	if err != nil || !ctl.Paused {
		t.Fatalf("Pause: %+v, %v", ctl, err)
	}
	if ctl, err = client.Resume(ctx, "empty"); err != nil || ctl.Paused {
		t.Fatalf("Resume: %+v, %v", ctl, err)
	}
	if _, err := client.SetRateLimit(ctx, "empty", delayqtype.RateLimit{Limit: -1}); !errors.Is(err, delayqtype.ErrInvalidRateLimit) {
		t.Fatalf("SetRateLimit -1: %v, want ErrInvalidRateLimit", err)
	}
	if _, err := payments.Enqueue(ctx, client, pool, outbox.Task{ID: "o-2", Delay: time.Hour}, payment{Order: "o-2"}); err != nil {
		t.Fatal(err)
	}
	if err := client.Reschedule(ctx, payments.Name, "o-2", time.Now().Add(2*time.Hour)); err != nil {
		t.Fatalf("Reschedule: %v", err)
	}
	if err := client.Cancel(ctx, payments.Name, "o-2"); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	// A task that never ran has no attempt; an unknown one is ErrNotFound.
	if a, err := client.Attempts(ctx, payments.Name, "o-2"); err != nil || len(a) != 0 {
		t.Fatalf("Attempts of a cancelled task: %+v, %v", a, err)
	}
	if _, err := client.Attempts(ctx, payments.Name, "nope"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Attempts of an unknown task: %v, want outbox.ErrNotFound", err)
	}
	if _, err := client.Attempts(ctx, "", "x"); err == nil {
		t.Fatal("Attempts of an empty queue name succeeded")
	}
	if err := client.Cancel(ctx, payments.Name, "nope"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Cancel of an unknown task: %v, want outbox.ErrNotFound", err)
	}
	if err := client.RetryDead(ctx, payments.Name, "o-2"); err == nil {
		t.Fatal("RetryDead of a cancelled task succeeded")
	}
	dead, err := client.DeadTasks(ctx, 10)
	if err != nil || len(dead) != 0 {
		t.Fatalf("DeadTasks: %v, %v", dead, err)
	}
	incs, err := client.Check(ctx)
	if err != nil || len(incs) != 0 {
		t.Fatalf("Check: %v, %v", incs, err)
	}
	if _, err := client.Reconcile(ctx); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	// Nothing registered, no relay: nothing to run.
	if err := client.Run(ctx); !errors.Is(err, delayq.ErrNoHandlers) {
		t.Fatalf("Run with nothing to run: %v, want ErrNoHandlers", err)
	}
}

// Bad configuration is refused before anything connects.
func TestClientConfig(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	rdb, _ := testenv.Redis(t)
	for name, tc := range map[string]struct {
		cfg  delayq.Config
		want error
	}{
		"schema":           {delayq.Config{Schema: "Bad-Schema"}, delayq.ErrInvalidConfig},
		"outbox schema":    {delayq.Config{Outbox: outbox.Config{Schema: "other"}}, delayq.ErrInvalidConfig},
		"relay channel":    {delayq.Config{Relay: &relay.Config{NotifyChannel: "other"}}, delayq.ErrInvalidConfig},
		"prefix":           {delayq.Config{Prefix: "bad prefix"}, delayq.ErrInvalidConfig},
		"lease":            {delayq.Config{Worker: delayq.WorkerConfig{Lease: time.Microsecond}}, delayq.ErrInvalidConfig},
		"same names, once": {delayq.Config{Schema: "public", Outbox: outbox.Config{Schema: "public"}}, nil},
		"database":         {delayq.Config{Database: "EU:1"}, delayq.ErrInvalidConfig},
		"database, long":   {delayq.Config{Database: strings.Repeat("d", 33)}, delayq.ErrInvalidConfig},
		"database prefix":  {delayq.Config{Prefix: strings.Repeat("p", 62), Database: "eu1"}, delayq.ErrInvalidConfig},
		"relay database":   {delayq.Config{Database: "eu1", Relay: &relay.Config{Database: "us1"}}, delayq.ErrInvalidConfig},
		"a database":       {delayq.Config{Database: "eu1", Relay: &relay.Config{}}, nil},
	} {
		if _, err := delayq.New(pool, rdb, tc.cfg); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if _, err := delayq.New(nil, rdb, delayq.Config{}); !errors.Is(err, delayq.ErrInvalidConfig) {
		t.Errorf("nil pool: %v", err)
	}
}
