package dispatch

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// Script replies arrive from go-redis as int64, string, nil and []any. The parsers
// below check every shape and return ErrUnexpectedReply instead of panicking.

func replyErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrUnexpectedReply}, args...)...)
}

func asArray(v any, what string) ([]any, error) {
	a, ok := v.([]any)
	if !ok {
		return nil, replyErr("%s: want an array, got %T", what, v)
	}
	return a, nil
}

func asInt(v any, what string) (int64, error) {
	n, ok := v.(int64)
	if !ok {
		return 0, replyErr("%s: want an integer, got %T", what, v)
	}
	return n, nil
}

func asString(v any, what string) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", replyErr("%s: want a string, got %T", what, v)
	}
	return s, nil
}

// asNumber reads an integer the scripts may send as an integer or as a string ("").
func asNumber(v any, what string) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		if x == "" {
			return 0, nil
		}
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return 0, replyErr("%s: %q is not an integer", what, x)
		}
		return n, nil
	}
	return 0, replyErr("%s: want an integer, got %T", what, v)
}

// formatScore turns t into a ZSET score: Unix seconds with a millisecond fraction,
// rounded up (ceilMilli), so that a task due at 12:00:00.0004 is never claimed at
// 12:00:00.000.
func formatScore(t time.Time) string {
	ms := ceilMilli(t).UnixMilli()
	return strconv.FormatInt(ms/1000, 10) + "." + fmt.Sprintf("%03d", ms%1000)
}

// ceilMilli rounds t up to a whole millisecond: the due time a task gets in Redis.
func ceilMilli(t time.Time) time.Time {
	if c := t.Truncate(time.Millisecond); c.Before(t) {
		return c.Add(time.Millisecond)
	}
	return t
}

// parseScore reads a ZSET score (seconds, possibly printed with binary noise such
// as "1700000000.1229999") back into a time, rounded to the millisecond.
func parseScore(s string) (time.Time, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > 1e14 {
		return time.Time{}, replyErr("score %q is not a time", s)
	}
	return time.UnixMilli(int64(math.Round(f * 1000))), nil
}

func scoreField(v any, what string) (time.Time, error) {
	s, err := asString(v, what)
	if err != nil {
		return time.Time{}, err
	}
	return parseScore(s)
}

func parseEnqueue(v any, n int) ([]EnqueueStatus, error) {
	a, err := asArray(v, "enqueue")
	if err != nil {
		return nil, err
	}
	if len(a) != n {
		return nil, replyErr("enqueue: %d statuses for %d tasks", len(a), n)
	}
	out := make([]EnqueueStatus, n)
	for i, x := range a {
		code, err := asInt(x, "enqueue status")
		if err != nil {
			return nil, err
		}
		switch code {
		case 0:
			out[i] = Duplicate
		case 1:
			out[i] = Added
		case 2:
			out[i] = Replaced
		default:
			return nil, replyErr("enqueue: status %d", code)
		}
	}
	return out, nil
}

// The claim reply: a head of claimHead elements, then claimGroup per task.
const (
	claimHead  = 7
	claimGroup = 9
)

func parseClaim(v any, queue string) (Claim, error) {
	a, err := asArray(v, "claim")
	if err != nil {
		return Claim{}, err
	}
	if len(a) < claimHead {
		return Claim{}, replyErr("claim: %d elements, want at least %d", len(a), claimHead)
	}
	next, err := asInt(a[0], "claim next_ms")
	if err != nil {
		return Claim{}, err
	}
	if next < -1 {
		return Claim{}, replyErr("claim: next_ms %d", next)
	}
	now, err := scoreField(a[1], "claim now")
	if err != nil {
		return Claim{}, err
	}
	until, err := scoreField(a[2], "claim lease_until")
	if err != nil {
		return Claim{}, err
	}
	count, err := asInt(a[3], "claim count")
	if err != nil {
		return Claim{}, err
	}
	if count < 0 || int64(len(a)-claimHead) != count*claimGroup {
		return Claim{}, replyErr("claim: count %d with %d fields", count, len(a)-claimHead)
	}
	rate, err := asInt(a[4], "claim rate_ms")
	if err != nil {
		return Claim{}, err
	}
	if rate < 0 || rate > maxMS {
		return Claim{}, replyErr("claim: rate_ms %d", rate)
	}
	held, err := asInt(a[5], "claim shards")
	if err != nil {
		return Claim{}, err
	}
	if held < 0 || held > MaxShards {
		return Claim{}, replyErr("claim: shards %d", held)
	}
	var resumed time.Time
	if r, ok := a[6].(string); !ok || r != "" {
		if resumed, err = scoreField(a[6], "claim resumed"); err != nil {
			return Claim{}, err
		}
	}
	c := Claim{NextDue: -1, Now: now, RateWait: time.Duration(rate) * time.Millisecond, shards: int(held)}
	if next >= 0 {
		c.NextDue = time.Duration(next) * time.Millisecond
	}
	if count > 0 {
		c.Tasks = make([]ClaimedTask, count)
	}
	for i := range c.Tasks {
		g := a[claimHead+i*claimGroup : claimHead+(i+1)*claimGroup]
		t := ClaimedTask{Queue: queue, LeaseUntil: until}
		if t.ID, err = asString(g[0], "claim id"); err != nil {
			return Claim{}, err
		}
		p, err := asString(g[1], "claim payload")
		if err != nil {
			return Claim{}, err
		}
		t.Payload = []byte(p)
		var n int64
		if n, err = asInt(g[2], "claim attempt"); err != nil {
			return Claim{}, err
		}
		t.Attempt = int(n)
		if n, err = asInt(g[3], "claim max_attempts"); err != nil {
			return Claim{}, err
		}
		t.MaxAttempts = int(n)
		if n, err = asInt(g[4], "claim version"); err != nil {
			return Claim{}, err
		}
		t.Version = int(n)
		if t.Token, err = asString(g[5], "claim token"); err != nil {
			return Claim{}, err
		}
		if t.Due, err = scoreField(g[6], "claim due"); err != nil {
			return Claim{}, err
		}
		if t.TraceContext, err = asString(g[7], "claim trace"); err != nil {
			return Claim{}, err
		}
		if sb, ok := g[8].(string); !ok || sb != "" {
			if t.StartBy, err = scoreField(g[8], "claim start_by"); err != nil {
				return Claim{}, err
			}
			t.Missed = now.After(t.StartBy)
		}
		if resumed.After(t.Due) {
			t.Resumed = resumed
		}
		c.Tasks[i] = t
	}
	return c, nil
}

// parseExtend reads an extend reply, the new deadline then one code per lease
// (1 renewed, 0 lost), onto dst. On an error dst comes back as it was.
func parseExtend(dst []bool, v any, n int) ([]bool, error) {
	a, err := asArray(v, "extend")
	if err != nil {
		return dst, err
	}
	if len(a) != n+1 {
		return dst, replyErr("extend: %d fields for %d leases", len(a), n)
	}
	if _, err := scoreField(a[0], "extend deadline"); err != nil {
		return dst, err
	}
	return appendApplied(dst, a[1:], "extend", n)
}

// parseCode reads an integer status that must be one of allowed.
func parseCode(v any, what string, allowed ...int64) (int64, error) {
	n, err := asInt(v, what)
	if err != nil {
		return 0, err
	}
	for _, a := range allowed {
		if n == a {
			return n, nil
		}
	}
	return 0, replyErr("%s: status %d", what, n)
}

// appendApplied reads a reply of one code per call item (1 applied, 0 not: a lost
// lease, a changed task), as complete and repair give, onto dst. On an error dst
// comes back as it was.
func appendApplied(dst []bool, v any, what string, n int) ([]bool, error) {
	a, err := asArray(v, what)
	if err != nil {
		return dst, err
	}
	if len(a) != n {
		return dst, replyErr("%s: %d codes for %d items", what, len(a), n)
	}
	out := dst
	for _, x := range a {
		code, err := parseCode(x, what, 0, 1)
		if err != nil {
			return dst, err
		}
		out = append(out, code == 1)
	}
	return out, nil
}

func parseIDs(v any, what string) ([]string, error) {
	a, err := asArray(v, what)
	if err != nil {
		return nil, err
	}
	if len(a) == 0 {
		return nil, nil
	}
	ids := make([]string, len(a))
	for i, x := range a {
		if ids[i], err = asString(x, what); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

func parseReap(v any) (ReapResult, error) {
	a, err := asArray(v, "reap")
	if err != nil {
		return ReapResult{}, err
	}
	if len(a) != 3 {
		return ReapResult{}, replyErr("reap: %d elements, want 3", len(a))
	}
	var r ReapResult
	if r.Requeued, err = parseIDs(a[0], "reap requeued"); err != nil {
		return ReapResult{}, err
	}
	if r.Exhausted, err = parseIDs(a[1], "reap exhausted"); err != nil {
		return ReapResult{}, err
	}
	if r.Orphans, err = parseIDs(a[2], "reap orphans"); err != nil {
		return ReapResult{}, err
	}
	return r, nil
}

func parseStats(v any) (Stats, error) {
	a, err := asArray(v, "stats")
	if err != nil {
		return Stats{}, err
	}
	if len(a) != 7 {
		return Stats{}, replyErr("stats: %d elements, want 7", len(a))
	}
	var n [5]int64
	for i := range n {
		if n[i], err = asInt(a[i], "stats count"); err != nil {
			return Stats{}, err
		}
	}
	s := Stats{Ready: n[0], DueNow: n[1], Active: n[2], ExpiredLeases: n[3], Dead: n[4]}
	if s.Now, err = scoreField(a[5], "stats now"); err != nil {
		return Stats{}, err
	}
	head, err := asString(a[6], "stats head")
	if err != nil {
		return Stats{}, err
	}
	if head != "" {
		h, err := parseScore(head)
		if err != nil {
			return Stats{}, err
		}
		s.NextDue = h
		if late := s.Now.Sub(h); late > 0 {
			s.OldestLateness = late
		}
	}
	return s, nil
}

const inspectGroup = 9

func parseInspect(v any, ids []string) ([]TaskInfo, error) {
	a, err := asArray(v, "inspect")
	if err != nil {
		return nil, err
	}
	if len(a) != len(ids)*inspectGroup {
		return nil, replyErr("inspect: %d fields for %d ids", len(a), len(ids))
	}
	out := make([]TaskInfo, len(ids))
	for i, id := range ids {
		g := a[i*inspectGroup : (i+1)*inspectGroup]
		ti := TaskInfo{ID: id}
		s, err := asString(g[0], "inspect status")
		if err != nil {
			return nil, err
		}
		switch s {
		case "":
			ti.State = StateMissing
		case "r":
			ti.State = StateReady
		case "a":
			ti.State = StateActive
		case "d":
			ti.State = StateDone
		case "x":
			ti.State = StateDead
		default:
			return nil, replyErr("inspect: status %q", s)
		}
		p, err := asString(g[1], "inspect payload")
		if err != nil {
			return nil, err
		}
		if p != "" {
			ti.Payload = []byte(p)
		}
		var n [3]int64
		for j := range n {
			if n[j], err = asNumber(g[2+j], "inspect number"); err != nil {
				return nil, err
			}
		}
		ti.Attempt, ti.MaxAttempts, ti.Version = int(n[0]), int(n[1]), int(n[2])
		if ti.LastError, err = asString(g[5], "inspect last error"); err != nil {
			return nil, err
		}
		sc, err := asString(g[6], "inspect score")
		if err != nil {
			return nil, err
		}
		if sc != "" {
			if ti.Score, err = parseScore(sc); err != nil {
				return nil, err
			}
		}
		ttl, err := asInt(g[7], "inspect ttl")
		if err != nil {
			return nil, err
		}
		if ttl > 0 {
			ti.TTL = time.Duration(ttl) * time.Millisecond
		}
		pr, err := asNumber(g[8], "inspect priority")
		if err != nil {
			return nil, err
		}
		ti.Priority = int(pr)
		out[i] = ti
	}
	return out, nil
}
