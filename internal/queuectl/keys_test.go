package queuectl_test

import (
	"errors"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
)

// The limits per concurrency key are a control like the pause: committed in
// Postgres, mirrored into Redis, and written back by the repair (the relay's
// sync) after Redis lost every key; bad limits change nothing.
func TestKeyLimitsSurviveRedisLoss(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	ctl, err := b.ctl.SetKeyLimits(ctx, "tenants", 2, 30, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if ctl.KeyConcurrency != 2 || ctl.KeyThrottle != 30 || ctl.KeyWindow != time.Minute {
		t.Fatalf("committed %+v", ctl)
	}
	b.inBoth(t, "tenants")

	for _, bad := range []struct{ conc, thr int }{{-1, 0}, {100001, 0}, {1, 10001}} {
		_, err := b.ctl.SetKeyLimits(ctx, "tenants", bad.conc, bad.thr, time.Second)
		if !errors.Is(err, validate.ErrInvalidKeyLimits) || !errors.Is(err, taskstate.ErrInvalidArgument) {
			t.Fatalf("SetKeyLimits(%d, %d) = %v", bad.conc, bad.thr, err)
		}
	}
	if _, err := b.ctl.SetKeyLimits(ctx, "tenants", 1, 5, 1500*time.Microsecond); !errors.Is(err, validate.ErrInvalidKeyLimits) {
		t.Fatalf("a window of 1.5ms: %v", err)
	}
	if got := b.inBoth(t, "tenants"); got.Version != ctl.Version {
		t.Fatalf("refused changes moved the version to %d", got.Version)
	}

	// Redis loses everything of ours (as FLUSHALL would; the test's Redis is shared).
	keys, err := b.rdb.Keys(ctx, b.dq.Config().Prefix+":*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys: %v, %v", keys, err)
	}
	if err := b.rdb.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
	if rc, _, _ := b.dq.Controls(ctx, "tenants"); rc.KeyConcurrency != 0 {
		t.Fatalf("after the loss Redis still holds %+v", rc)
	}
	n, err := queuectl.Restore(ctx, b.pool, b.dq, "", false)
	if err != nil || n < 1 {
		t.Fatalf("restore: %d, %v", n, err)
	}
	b.inBoth(t, "tenants")

	// Lifting both.
	if _, err := b.ctl.SetKeyLimits(ctx, "tenants", 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	if got := b.inBoth(t, "tenants"); got.KeyConcurrency != 0 || got.KeyThrottle != 0 || got.KeyWindow != 0 {
		t.Fatalf("lifted: %+v", got)
	}
}
