package outbox

import (
	"fmt"
	"time"

	"github.com/delayq/delayq/internal/validate"
)

// BucketID returns the task id of key in the time bucket holding t: key, "@", and
// the bucket's start in UTC ("20060102T150405Z"; "20060102T150405.000Z" when the
// bucket is not a whole number of seconds), so the ids of one key and one bucket
// length sort in time order. Enqueue tasks of one business action with it
// to run that action at most once per bucket:
//
//	id, err := outbox.BucketID("order-7", time.Hour, time.Now()) // "order-7@20250501T100000Z"
//	res, err := ob.Enqueue(ctx, tx, outbox.Task{Queue: "reminder", ID: id, Delay: 5 * time.Minute})
//	// res.Duplicate: this order already had its reminder in this hour
//
// Buckets are aligned as time.Time.Truncate aligns them, on the zero time: whole
// minutes, hours and days start at UTC boundaries, 7-day buckets on Mondays at 00:00
// UTC. bucket is at least a millisecond and a whole number of them.
//
// The uniqueness window is the outbox's: the second enqueue of an id is a duplicate
// for as long as the first one's row is kept, that is while the task is pending,
// queued or dead, and for the relay's Retention (7 days by default) after it is done
// or cancelled. A bucket longer than that retention is therefore not a guarantee:
// once the row is pruned, the same id enqueues again.
//
// The error wraps ErrInvalidTaskID when key is not a task id or the result would be
// longer than 200 bytes, ErrInvalidTask for a bad bucket or a zero t.
func BucketID(key string, bucket time.Duration, t time.Time) (string, error) {
	if err := validate.TaskID(key); err != nil {
		return "", fmt.Errorf("outbox: bucket id: %w", err)
	}
	if bucket < time.Millisecond || bucket%time.Millisecond != 0 {
		return "", fmt.Errorf("outbox: bucket id: %w: bucket %v: a whole number of milliseconds, at least 1ms", validate.ErrInvalidRunAt, bucket)
	}
	if t.IsZero() {
		return "", fmt.Errorf("outbox: bucket id: %w: zero time", validate.ErrInvalidRunAt)
	}
	id := key + "@" + validate.TimeID(t.Truncate(bucket), bucket%time.Second != 0)
	if err := validate.TaskID(id); err != nil {
		return "", fmt.Errorf("outbox: bucket id: %w", err)
	}
	return id, nil
}
