package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

func TestBucketID(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 5, 1, 10, 42, 7, 123e6, time.FixedZone("CEST", 2*3600))
	for _, c := range []struct {
		bucket time.Duration
		want   string
	}{
		{time.Hour, "order-7@20250501T080000Z"},
		{time.Minute, "order-7@20250501T084200Z"},
		{24 * time.Hour, "order-7@20250501T000000Z"},
		{7 * 24 * time.Hour, "order-7@20250428T000000Z"}, // a Monday
		{time.Millisecond, "order-7@20250501T084207.123Z"},
		{250 * time.Millisecond, "order-7@20250501T084207.000Z"},
	} {
		got, err := outbox.BucketID("order-7", c.bucket, at)
		if err != nil || got != c.want {
			t.Errorf("BucketID(order-7, %v) = %q, %v; want %q", c.bucket, got, err, c.want)
		}
	}
	// Every time inside one bucket gives the same id; the next bucket another.
	a, _ := outbox.BucketID("k", time.Hour, at.Truncate(time.Hour))
	b, _ := outbox.BucketID("k", time.Hour, at.Truncate(time.Hour).Add(time.Hour-time.Nanosecond))
	c, _ := outbox.BucketID("k", time.Hour, at.Truncate(time.Hour).Add(time.Hour))
	if a != b || a == c {
		t.Errorf("bucket edges: %q %q %q", a, b, c)
	}
	for _, bad := range []struct {
		key    string
		bucket time.Duration
		at     time.Time
		want   error
	}{
		{"", time.Hour, at, outbox.ErrInvalidTaskID},
		{"a b", time.Hour, at, outbox.ErrInvalidTaskID},
		{strings.Repeat("k", 190), time.Hour, at, outbox.ErrInvalidTaskID},
		{"k", 0, at, validate.ErrInvalidRunAt},
		{"k", 1500 * time.Microsecond, at, validate.ErrInvalidRunAt},
		{"k", time.Hour, time.Time{}, validate.ErrInvalidRunAt},
	} {
		if _, err := outbox.BucketID(bad.key, bad.bucket, bad.at); !errors.Is(err, bad.want) {
			t.Errorf("BucketID(%.20q, %v, %v): %v, want %v", bad.key, bad.bucket, bad.at, err, bad.want)
		}
	}
}

// TestBucketIDOncePerBucket enqueues one business key many times over three
// buckets on a real outbox: one task per bucket, the rest duplicates.
func TestBucketIDOncePerBucket(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := time.Date(2025, 5, 1, 10, 0, 0, 0, time.UTC)
	inserted := 0
	for i := range 30 {
		id, err := outbox.BucketID("order-7", time.Hour, start.Add(time.Duration(i)*6*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		res, err := ob.Enqueue(ctx, pool, outbox.Task{Queue: "reminder", ID: id, Delay: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Duplicate {
			inserted++
		}
	}
	if inserted != 3 {
		t.Fatalf("%d tasks over 3 hours of enqueues, want one per hour", inserted)
	}
}
