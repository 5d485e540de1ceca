package dispatch

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The history of a queue is written by the scripts a worker already calls, at no
// extra round trip: claim adds each claimed task's lateness (claim time minus due
// time, by the Redis clock) to a histogram, complete counts the tasks done. Both
// go to one HASH per queue and minute (Keys.History + the Unix minute), kept for
// HistoryRetention: its size depends on the minutes and the buckets used, never on
// the number of tasks.
//
//	d     tasks acknowledged done in that minute
//	l<b>  tasks claimed in that minute with lateness in bucket b (LatenessBucket)

// HistoryRetention is how long a minute of history is kept (the hash's TTL).
const HistoryRetention = 2 * time.Hour

// LatenessBuckets is the number of buckets of a lateness Histogram.
const LatenessBuckets = 121

// Histogram counts claims by lateness bucket (LatenessBucket).
type Histogram [LatenessBuckets]int64

// LatenessBucket returns the bucket of a lateness d, as the claim script computes
// it: 0 below 1 ms; then four buckets per power of two of milliseconds, bucket
// 1+4e+s holding [2^e·(1+s/4), 2^e·(1+(s+1)/4)) ms; the last, 120, everything from
// 2^29·1.75 ms (about 11 days) on. A bucket is at most 25% wide.
func LatenessBucket(d time.Duration) int {
	ms := d.Milliseconds()
	if ms < 1 {
		return 0
	}
	frac, exp := math.Frexp(float64(ms)) // exact for these integers
	return min(1+4*(exp-1)+int((2*frac-1)*4), LatenessBuckets-1)
}

// BucketBounds returns the lateness range [lo, hi) of bucket b.
func BucketBounds(b int) (lo, hi time.Duration) {
	if b <= 0 {
		return 0, time.Millisecond
	}
	e, s := (b-1)/4, (b-1)%4
	ms := func(s int) time.Duration {
		return time.Duration(float64(int64(1)<<e)*(1+float64(s)/4)*1e6) * time.Nanosecond
	}
	if b >= LatenessBuckets-1 {
		return ms(s), time.Duration(math.MaxInt64)
	}
	return ms(s), ms(s + 1)
}

// Count returns the claims counted.
func (h *Histogram) Count() int64 {
	var n int64
	for _, c := range h {
		n += c
	}
	return n
}

// Merge adds o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o {
		h[i] += c
	}
}

// Quantile returns the lateness at or under which a fraction q (0..1) of the claims
// fell: the upper bound of the bucket holding it, so at most 25% above the truth
// (for the last bucket, its lower bound). ok is false for an empty histogram.
func (h *Histogram) Quantile(q float64) (d time.Duration, ok bool) {
	n := h.Count()
	if n == 0 {
		return 0, false
	}
	rank := max(int64(math.Ceil(q*float64(n))), 1)
	var seen int64
	for b, c := range h {
		seen += c
		if seen >= rank {
			lo, hi := BucketBounds(b)
			if b == LatenessBuckets-1 {
				return lo, true
			}
			return hi, true
		}
	}
	return 0, false // unreachable: seen reaches n
}

// Minute is one minute of a queue's history.
type Minute struct {
	// Start is the minute's first instant (UTC).
	Start time.Time
	// Done counts the tasks acknowledged done in the minute.
	Done int64
	// Lateness counts the claims of the minute by lateness; its Count is the
	// claims (runs started).
	Lateness Histogram
}

// History reads the last minutes (1..HistoryRetention's 120) of each queue's
// history, the minute of now last, oldest first: one pipelined round trip for every
// queue (one HGETALL per queue, shard and minute; a sharded queue's shards
// summed). now is the caller's clock, which the
// minutes follow (the scripts use the Redis clock: a clock a few seconds apart
// moves a few seconds of counts into the next minute).
func (c *Client) History(ctx context.Context, now time.Time, minutes int, queues ...string) (map[string][]Minute, error) {
	if minutes < 1 || minutes > int(HistoryRetention/time.Minute) {
		return nil, fmt.Errorf("%w: history of %d minutes: 1..%d", ErrInvalidArgument, minutes, int(HistoryRetention/time.Minute))
	}
	last := now.Unix() / 60
	keys, of, err := c.everyShard(ctx, queues)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]Minute, len(queues))
	if len(queues) == 0 {
		return out, nil
	}
	cmds := make([]*redis.MapStringStringCmd, 0, len(keys)*minutes)
	_, err = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			for m := last - int64(minutes) + 1; m <= last; m++ {
				cmds = append(cmds, p.HGetAll(ctx, k.History+strconv.FormatInt(m, 10)))
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("delayq: history: %w", err)
	}
	for _, q := range queues {
		ms := make([]Minute, minutes)
		for j := range ms {
			ms[j].Start = time.Unix((last-int64(minutes)+1+int64(j))*60, 0).UTC()
		}
		out[q] = ms
	}
	for s, i := range of {
		ms := out[queues[i]]
		for j := range ms {
			var m Minute
			if err := parseMinute(cmds[s*minutes+j].Val(), &m); err != nil {
				return nil, fmt.Errorf("delayq: history %s: %w", queues[i], err)
			}
			ms[j].Done += m.Done
			ms[j].Lateness.Merge(&m.Lateness)
		}
	}
	return out, nil
}

// parseMinute reads a history hash; fields it does not know are skipped (a newer
// script may add some).
func parseMinute(f map[string]string, m *Minute) error {
	for k, v := range f {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("%w: history field %s=%q", ErrUnexpectedReply, k, v)
		}
		switch {
		case k == "d":
			m.Done = n
		case strings.HasPrefix(k, "l"):
			b, err := strconv.Atoi(k[1:])
			if err == nil && b >= 0 && b < LatenessBuckets {
				m.Lateness[b] = n
			}
		}
	}
	return nil
}
