package main

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/validate"
)

const queueUsage = `Usage: delayq queue <action> [flags]

Actions:
  pause QUEUE         stop every worker claiming from QUEUE, from its next claim on
  resume QUEUE        let workers claim from QUEUE again (sleeping workers wake at once)
  limit QUEUE RATE    cap QUEUE's starts across all workers: N/PERIOD, or none
  shards QUEUE N      split QUEUE's Redis keys into N shards (1..64); only while it is empty
  keys QUEUE          cap the runs of one concurrency key at once, and throttle its starts
  list                every queue ever paused, limited or sharded, in Postgres and in Redis

Examples:
  delayq queue pause payment
  delayq queue resume payment
  delayq queue limit payment 100/s
  delayq queue limit mail 6000/1m --burst 50
  delayq queue limit payment none
  delayq queue shards payment 8
  delayq queue keys mail --concurrency 2 --throttle 10/1m
  delayq queue list --json

A pause is written to PostgreSQL (the table delayq_queues, the truth) and then to
Redis (dq:{queue}:ctl), which the claim script reads: once 'pause' returns, no
worker claims from the queue. Tasks keep their due times and run when the queue is
resumed; enqueues and the relay go on. A rate limit is kept the same way; the
claim script spaces the queue's starts PERIOD/N apart by the Redis clock (GCRA),
letting up to --burst follow one another after an idle spell, whatever the number
of workers. The shard count is kept the same way too. The relay mirrors the
controls from PostgreSQL every few seconds, so a Redis that lost them gets them
back.

Run 'delayq queue <action> --help' for the flags of each.
`

func runQueue(ctx context.Context, m *Main, args []string) error {
	if len(args) == 0 {
		return usagef("want an action: pause, resume, limit, shards, keys or list (see --help)")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(m.Stdout, queueUsage)
		return errHelp
	case "pause":
		return runQueueSet(ctx, m, "pause", true, args[1:])
	case "resume":
		return runQueueSet(ctx, m, "resume", false, args[1:])
	case "limit":
		return runQueueLimit(ctx, m, args[1:])
	case "shards":
		return runQueueShards(ctx, m, args[1:])
	case "keys":
		return runQueueKeys(ctx, m, args[1:])
	case "list":
		return runQueueList(ctx, m, args[1:])
	}
	return usagef("unknown action %q: want pause, resume, limit, shards, keys or list", args[0])
}

// queueOptions is what 'delayq queue ACTION' was asked.
type queueOptions struct {
	conn   connFlags
	queue  string
	rate   delayqtype.RateLimit // limit
	shards int                  // shards
	json   bool                 // list
}

// parse parses the flags and the positional arguments (the queue first) of
// action, and checks the queue's name.
func (o *queueOptions) parse(fs *flagSet, m *Main, args []string, positional int) error {
	o.conn.register(fs, m, true, true)
	if err := parseArgs(fs, args, positional); err != nil {
		return err
	}
	if positional == 0 {
		return nil
	}
	o.queue = fs.Arg(0)
	if err := validate.Queue(o.queue); err != nil {
		return usagef("%v", err)
	}
	return nil
}

// runQueueSet pauses or resumes through the client.
func runQueueSet(ctx context.Context, m *Main, action string, paused bool, args []string) error {
	var o queueOptions
	fs := newFlagSet(m, "queue "+action, "queue "+action+" [flags] QUEUE",
		"  delayq queue "+action+" payment\n")
	if err := o.parse(fs, m, args, 1); err != nil {
		return err
	}
	if paused {
		return o.change(ctx, m, (*delayq.Client).Pause, o.queue+" paused")
	}
	return o.change(ctx, m, (*delayq.Client).Resume, o.queue+" resumed")
}

// runQueueLimit sets the rate limit through the client.
func runQueueLimit(ctx context.Context, m *Main, args []string) error {
	var o queueOptions
	fs := newFlagSet(m, "queue limit", "queue limit [flags] QUEUE RATE",
		"  delayq queue limit payment 100/s\n  delayq queue limit mail 6000/1m --burst 50\n  delayq queue limit payment none\n\n"+
			"RATE is N/PERIOD: at most N starts per PERIOD (1ms to years: 10/s, 100/1s, 6000/1m,\n"+
			"5/250ms), spaced PERIOD/N apart, across every worker; none (or 0) lifts the limit.\n")
	burst := fs.Int("burst", 0, "starts allowed one right after the other, after an idle spell or a late wake-up\n(1.."+fmt.Sprint(validate.MaxRateBurst)+"; 0: the starts of 100ms at the limit, at least 1)")
	if err := o.parse(fs, m, args, 2); err != nil {
		return err
	}
	rate, err := parseRate(fs.Arg(1))
	if err != nil {
		return usagef("%v", err)
	}
	rate.Burst = *burst
	o.rate = rate.WithDefaults()
	if err := o.rate.Validate(); err != nil {
		return usagef("%v", err)
	}
	return o.change(ctx, m, func(c *delayq.Client, ctx context.Context, queue string) (delayqtype.QueueControl, error) {
		return c.SetRateLimit(ctx, queue, o.rate)
	}, o.queue+" rate limit "+o.rate.String())
}

const queueKeysHelp = `  delayq queue keys mail --concurrency 1
  delayq queue keys api --concurrency 4 --throttle 100/1m
  delayq queue keys mail --concurrency 0 --throttle none

Limits per concurrency key (outbox.Task.ConcurrencyKey: a tenant, an account),
across every worker: --concurrency N lets at most N tasks of one key run at once
(1 is one at a time per key; 0 none), --throttle N/PERIOD at most N of one key
start in any PERIOD (none lifts it). Tasks without a key are not limited. A task
whose key is at a limit waits apart until its key may start again; the other
keys' tasks run meanwhile. Both limits are set together: a flag left out is 0
(none). Written to PostgreSQL (delayq_queues, the truth) and then to Redis.
`

// runQueueKeys sets the limits per concurrency key through the client.
func runQueueKeys(ctx context.Context, m *Main, args []string) error {
	var o queueOptions
	fs := newFlagSet(m, "queue keys", "queue keys [flags] QUEUE", queueKeysHelp)
	concurrency := fs.Int("concurrency", 0, "runs of one key at once (0: no cap, 1.."+fmt.Sprint(validate.MaxKeyConcurrency)+")")
	throttle := fs.String("throttle", "none", "starts of one key per window: N/PERIOD (10/1m, 5/1s), or none")
	if err := o.parse(fs, m, args, 1); err != nil {
		return err
	}
	t, err := parseRate(*throttle)
	if err != nil {
		return usagef("--throttle: %v", err)
	}
	if err := validate.KeyLimits(*concurrency, t.Limit, t.Period); err != nil {
		return usagef("%v", err)
	}
	what := fmt.Sprintf("%s keys: concurrency %d, throttle %s", o.queue, *concurrency, cmp.Or(rateText(t), "none"))
	return o.change(ctx, m, func(c *delayq.Client, ctx context.Context, queue string) (delayqtype.QueueControl, error) {
		return c.SetKeyLimits(ctx, queue, *concurrency, t.Limit, t.Period)
	}, what)
}

const queueShardsHelp = `  delayq queue shards payment 8
  delayq queue shards payment 1

N (1..64) is the number of shards QUEUE's Redis keys are split into, each in a
Redis Cluster slot of its own (spread over the masters): a queue too busy for one
master spreads over several. Each task keeps to the shard its id hashes to, so
change it only while the queue is empty (no pending, queued or dead tasks, in
PostgreSQL or in Redis) and, safest, with the queue's producers stopped: the
command refuses, and writes nothing, while either store holds a task of the
queue. The count is written to PostgreSQL (delayq_queues, the truth) and then
to Redis; every running worker and relay picks it up within seconds. Setting
the count the queue has already changes nothing.
`

// runQueueShards sets the shard count through the client.
func runQueueShards(ctx context.Context, m *Main, args []string) error {
	var o queueOptions
	fs := newFlagSet(m, "queue shards", "queue shards [flags] QUEUE N", queueShardsHelp)
	if err := o.parse(fs, m, args, 2); err != nil {
		return err
	}
	n, err := strconv.Atoi(fs.Arg(1))
	if err != nil {
		return usagef("%v: %q is not a number: 1..%d", validate.ErrInvalidShards, fs.Arg(1), validate.MaxShards)
	}
	if err := validate.Shards(n); err != nil {
		return usagef("%v", err)
	}
	o.shards = n
	return o.change(ctx, m, func(c *delayq.Client, ctx context.Context, queue string) (delayqtype.QueueControl, error) {
		return c.SetShards(ctx, queue, o.shards)
	}, fmt.Sprintf("%s shards %d", o.queue, n))
}

// parseRate reads N/PERIOD ("100/s", "6000/1m", "5/250ms"), or none (or 0).
func parseRate(s string) (validate.RateLimit, error) {
	if s == "none" || s == "0" {
		return validate.RateLimit{Period: time.Second}, nil
	}
	ns, ps, ok := strings.Cut(s, "/")
	if !ok {
		return validate.RateLimit{}, fmt.Errorf("rate %q: want N/PERIOD (100/s, 6000/1m) or none", s)
	}
	n, err := strconv.Atoi(ns)
	if err != nil || n < 1 || n > validate.MaxRateLimit {
		return validate.RateLimit{}, fmt.Errorf("rate %q: N must be an integer in 1..%d", s, validate.MaxRateLimit)
	}
	if ps != "" && (ps[0] < '0' || ps[0] > '9') {
		ps = "1" + ps // "s" is "1s"
	}
	p, err := time.ParseDuration(ps)
	if err != nil {
		return validate.RateLimit{}, fmt.Errorf("rate %q: PERIOD: %w", s, err)
	}
	if p <= 0 {
		return validate.RateLimit{}, fmt.Errorf("rate %q: PERIOD must be positive", s)
	}
	r := validate.RateLimit{Limit: n, Period: p}
	if err := r.WithDefaults().Validate(); err != nil {
		return validate.RateLimit{}, err
	}
	return r, nil
}

// change makes one change of o.queue's controls through the client
// (PostgreSQL, the truth, then Redis's copy at the new version) and prints done.
func (o *queueOptions) change(ctx context.Context, m *Main,
	set func(*delayq.Client, context.Context, string) (delayqtype.QueueControl, error), done string,
) error {
	s, err := o.conn.openStores(ctx, true)
	if err != nil {
		return err
	}
	defer s.close()
	if _, err := set(s.client, ctx, o.queue); err != nil {
		return err
	}
	fmt.Fprintln(m.Stdout, done)
	return nil
}

// queueRow is one line of queue list.
type queueRow struct {
	Queue       string `json:"queue"`
	Paused      bool   `json:"paused"`
	RedisPaused bool   `json:"redis_paused"`
	// RateLimit is "N/PERIOD" ("" for none); BurstLimit its burst.
	RateLimit      string `json:"rate_limit,omitempty"`
	RateBurst      int    `json:"rate_burst,omitempty"`
	RedisRateLimit string `json:"redis_rate_limit,omitempty"`
	Shards         int    `json:"shards"`
	RedisShards    int    `json:"redis_shards"`
	Version        int64  `json:"version"`
	RedisVersion   int64  `json:"redis_version"`
	UpdatedAt      string `json:"updated_at"`
	// KeyConcurrency and KeyThrottle ("N/PERIOD") are the limits per
	// concurrency key (0, "": none).
	KeyConcurrency int    `json:"key_concurrency,omitempty"`
	KeyThrottle    string `json:"key_throttle,omitempty"`
}

// rateText is "100/1s", or "" for no limit.
func rateText(r validate.RateLimit) string {
	if r.Limit == 0 {
		return ""
	}
	return fmt.Sprintf("%d/%v", r.Limit, r.Period)
}

// runQueueList lists the controls through the client, and Redis's copy of
// them through internal/dispatch (the client shows PostgreSQL's alone).
func runQueueList(ctx context.Context, m *Main, args []string) error {
	var o queueOptions
	fs := newFlagSet(m, "queue list", "queue list [flags]",
		"  delayq queue list\n  delayq queue list --json\n\n"+
			"PAUSED, LIMIT and SHARDS are PostgreSQL's (the truth), REDIS what the claim script sees.\n")
	fs.BoolVar(&o.json, "json", false, "print the list as JSON")
	if err := o.parse(fs, m, args, 0); err != nil {
		return err
	}
	s, err := o.conn.openStores(ctx, true)
	if err != nil {
		return err
	}
	defer s.close()
	ctls, err := s.client.Queues(ctx)
	if err != nil {
		return err
	}
	rows := make([]queueRow, 0, len(ctls))
	for _, c := range ctls {
		rc, rv, err := s.dq.Controls(ctx, c.Queue)
		if err != nil {
			return err
		}
		row := queueRow{Queue: c.Queue, Paused: c.Paused, RedisPaused: rc.Paused, Version: c.Version, RedisVersion: rv,
			RateLimit: rateText(c.Rate), RedisRateLimit: rateText(rc.Rate),
			Shards: c.Shards, RedisShards: max(1, rc.Shards),
			UpdatedAt:      c.UpdatedAt.UTC().Format("2006-01-02T15:04:05Z"),
			KeyConcurrency: c.KeyConcurrency, KeyThrottle: rateText(validate.RateLimit{Limit: c.KeyThrottle, Period: c.KeyWindow})}
		if c.Rate.Limit > 0 {
			row.RateBurst = c.Rate.Burst
		}
		rows = append(rows, row)
	}
	if o.json {
		return writeJSON(m.Stdout, rows)
	}
	if len(rows) == 0 {
		fmt.Fprintln(m.Stdout, "no queue was ever paused, limited or sharded")
		return nil
	}
	tw := newTable(m.Stdout, "QUEUE\tPAUSED\tLIMIT\tBURST\tSHARDS\tREDIS\tVERSION\tUPDATED")
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	orNone := func(s string) string { return cmp.Or(s, "none") }
	for _, r := range rows {
		// REDIS: what the claim script sees, "same" when it is Postgres's version.
		redis := "same"
		if r.RedisVersion != r.Version {
			redis = fmt.Sprintf("v%d paused %s limit %s shards %d", r.RedisVersion, yes(r.RedisPaused), orNone(r.RedisRateLimit), r.RedisShards)
		}
		burst := "-"
		if r.RateBurst > 0 {
			burst = fmt.Sprint(r.RateBurst)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\n", r.Queue, yes(r.Paused), orNone(r.RateLimit), burst, r.Shards, redis, r.Version, r.UpdatedAt)
	}
	return tw.Flush()
}

// pausedQueues tells, for stats, whether each queue is paused as Postgres says:
// "yes" or "no"; "-" for every queue when the controls cannot be read (an outbox
// not migrated to 00004 yet).
func pausedQueues(ctx context.Context, c *delayq.Client) func(queue string) string {
	ctls, err := c.Queues(ctx)
	if err != nil {
		return func(string) string { return "-" }
	}
	paused := map[string]bool{}
	for _, c := range ctls {
		paused[c.Queue] = c.Paused
	}
	return func(q string) string {
		if paused[q] {
			return "yes"
		}
		return "no"
	}
}
