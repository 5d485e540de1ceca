package taskstate

import (
	"context"
	"errors"
	"testing"

	"github.com/delayq/delayq/internal/testenv"
)

func TestQueueControls(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	s := New(Config{Schema: "public"})
	if c, err := s.QueueControls(ctx, pool); err != nil || len(c) != 0 {
		t.Fatalf("no queue paused yet: %v, %v", c, err)
	}
	v1, err := s.SetPaused(ctx, pool, "b", true)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := s.SetPaused(ctx, pool, "b", false)
	if err != nil || v2 <= v1 {
		t.Fatalf("versions %d then %d (%v): each change must bump it", v1, v2, err)
	}
	if _, err := s.SetPaused(ctx, pool, "a", true); err != nil {
		t.Fatal(err)
	}
	c, err := s.QueueControls(ctx, pool)
	if err != nil || len(c) != 2 || c[0].Queue != "a" || !c[0].Paused || c[1].Queue != "b" || c[1].Paused || c[1].Version != v2 {
		t.Fatalf("controls %+v, %v", c, err)
	}
	if _, err := s.SetPaused(ctx, pool, "bad queue", true); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("invalid queue: %v", err)
	}
}
