package schedrun

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/schedule"
)

// noTx is a database whose transactions never start: a runner registers its
// schedules (one statement) and stops before its first evaluation.
type noTx struct{ outbox.DB }

func (noTx) Begin(context.Context) (pgx.Tx, error) { return nil, errors.New("no transaction") }

// TestListBeforeFirstEvaluation: a schedule registered and not yet evaluated is
// listed with its next tick, not as one with none (the dashboard read the row
// in between and showed "none within five years").
func TestListBeforeFirstEvaluation(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	ob, err := outbox.New(outbox.Config{Schema: "public"})
	if err != nil {
		t.Fatal(err)
	}
	s := schedule.Schedule{Name: "nightly", Queue: "reports", Cron: "0 3 * * *", TimeZone: "Europe/Paris"}
	r, err := New(schedule.Config{Schedules: []schedule.Schedule{s}}, ob, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.RunOnce(ctx, noTx{pool}); err == nil {
		t.Fatal("RunOnce without transactions succeeded")
	}
	states, err := List(ctx, pool, "public", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(states) != 1 || states[0].LastTick != nil {
		t.Fatalf("states = %+v, want the registered schedule, no tick enqueued", states)
	}
	want, err := schedule.Next(s, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	got := states[0].NextTick
	if got == nil || !got.Equal(want) || got.Location().String() != "Europe/Paris" {
		t.Fatalf("next tick = %v, want %v in Europe/Paris", got, want)
	}
}
