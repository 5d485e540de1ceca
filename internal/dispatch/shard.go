package dispatch

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delayq/delayq/internal/validate"
)

// MaxShards is the most shards a queue's Redis keys can be split into.
const MaxShards = 64

// A sharded queue (Controls.Shards > 1, its truth in Postgres: outbox's queue
// controls) keeps its tasks in Shards sets of keys, each a queue of its own to
// the scripts: one hash tag, so one Cluster slot, per shard. A task lives in shard
// ShardOf(id, shards) for its whole life, so its dedupe record, its leases and
// its history never cross shards. Shard 0 is the queue's unsharded layout
// ("{payment}"), so a queue of one shard is laid out as before shards existed.
//
// Shard k > 0 has the hash tag "<queue>#<k>.<s>" with the smallest s >= 0 that
// puts its slot in the k-th of shards equal windows of the slot space, counted
// from shard 0's slot (each window's first quarter): a cluster whose masters own
// equal runs of slots, as redis-cli --cluster create lays them out, gets the
// shards spread evenly over its masters. '#' is not allowed in queue names, so no
// shard's keys can be another queue's.

// ShardOf returns the shard of task id in a queue of shards shards: FNV-1a (32
// bit) of the id modulo shards; 0 when shards <= 1.
func ShardOf(id string, shards int) int {
	if shards <= 1 {
		return 0
	}
	// FNV-1a inline rather than hash/fnv: no allocation for each routed task.
	h := uint32(2166136261)
	for i := 0; i < len(id); i++ {
		h ^= uint32(id[i])
		h *= 16777619
	}
	return int(h % uint32(shards))
}

// slots is the number of Redis Cluster hash slots.
const slots = 16384

// shardTag returns the hash tag of shard k of queue in a queue of shards shards.
func shardTag(queue string, k, shards int) string {
	if k == 0 {
		return queue
	}
	window := slots / shards
	start := (int(crc16([]byte(queue))%slots) + k*window) % slots
	width := max(1, window/4)
	base := queue + "#" + strconv.Itoa(k) + "."
	for s := 0; ; s++ {
		tag := base + strconv.Itoa(s)
		if (int(crc16([]byte(tag))%slots)-start+slots)%slots < width {
			return tag
		}
	}
}

// ShardKeys builds the keys of shard k (0..shards-1) of queue under prefix, as
// KeysFor does for shard 0. Every shard's Wake is the queue's one channel.
func ShardKeys(prefix, queue string, k, shards int) (Keys, error) {
	if shards < 1 || shards > MaxShards || k < 0 || k >= shards {
		return Keys{}, fmt.Errorf("%w: shard %d of %d: shards 1..%d", ErrInvalidArgument, k, shards, MaxShards)
	}
	k0, err := KeysFor(prefix, queue)
	if err != nil || k == 0 {
		return k0, err
	}
	return layout(prefix, shardTag(queue, k, shards), k0.Wake), nil
}

// A Client learns a queue's shard count from the field n of the controls hash of
// its shard 0 (absent: 1 shard), mirrored from Postgres by SetControls, and trusts
// it for Config.ShardRefresh. A stale count never misroutes a task: the enqueue
// script compares the count it was given with its shard's n and refuses a
// mismatch (the error "SHARDS <n>"), after which the Client reads the count again and
// routes anew. A claim also reports the count shard 0 holds, and a Client routed
// by another takes it at once. Callers that hold the count Postgres holds (the
// relay, reconcile) pass it instead (QueueTasks.Shards, ProbeRouted,
// RepairIfRouted), so a count Redis lost never routes their calls. Claims name
// their shard in the lease token, so a lease is settled in its own shard whatever
// count the Client holds by then.

// shardCount is a queue's shard count as a Client read it.
type shardCount struct {
	n  int
	at time.Time
}

// shardLayout is the keys of every shard of a queue of n shards.
type shardLayout struct {
	queue string
	n     int
}

// shardCache holds the counts a Client read and the key layouts it built.
type shardCache struct {
	mu      sync.RWMutex
	counts  map[string]shardCount
	layouts map[shardLayout][]Keys
}

// Shards returns queue's shard count as this Client knows it: read from Redis (the
// mirror of Postgres' count) at most Config.ShardRefresh ago.
func (c *Client) Shards(ctx context.Context, queue string) (int, error) {
	if err := validate.Queue(queue); err != nil {
		return 0, err
	}
	c.sh.mu.RLock()
	sc, ok := c.sh.counts[queue]
	c.sh.mu.RUnlock()
	if ok && time.Since(sc.at) < c.cfg.ShardRefresh {
		return sc.n, nil
	}
	return c.readShards(ctx, queue)
}

// readShards reads queue's shard count from Redis. An absent count is 1, unless
// this Client read one before: a controls hash lost with Redis's data must not
// collapse a sharded queue into shard 0 until the relay restores it (the enqueue
// script then accepts any count).
func (c *Client) readShards(ctx context.Context, queue string) (int, error) {
	k, err := c.Keys(queue)
	if err != nil {
		return 0, err
	}
	// HMGET, not HGET: the least ACLs of docs/SECURITY.md give every role HMGET.
	f, err := c.rdb.HMGet(ctx, k.Control, "n").Result()
	if err != nil {
		return 0, fmt.Errorf("delayq: shards of %s: %w", queue, err)
	}
	c.sh.mu.Lock()
	defer c.sh.mu.Unlock()
	n := 1
	if prev, ok := c.sh.counts[queue]; ok {
		n = prev.n
	}
	if s, held := f[0].(string); held {
		v, perr := strconv.Atoi(s)
		if perr != nil || v < 1 || v > MaxShards {
			return 0, fmt.Errorf("delayq: shards of %s: %w: controls hold n %q", queue, ErrUnexpectedReply, s)
		}
		n = v
	}
	if c.sh.counts == nil {
		c.sh.counts = map[string]shardCount{}
	}
	c.sh.counts[queue] = shardCount{n: n, at: time.Now()}
	return n, nil
}

// learnShards records n, queue's shard count as a script just reported it, as if
// read from Redis now.
func (c *Client) learnShards(queue string, n int) {
	c.sh.mu.Lock()
	if c.sh.counts == nil {
		c.sh.counts = map[string]shardCount{}
	}
	c.sh.counts[queue] = shardCount{n: n, at: time.Now()}
	c.sh.mu.Unlock()
}

// forgetShards makes the next Shards of queue read Redis again.
func (c *Client) forgetShards(queue string) {
	c.sh.mu.Lock()
	if sc, ok := c.sh.counts[queue]; ok {
		sc.at = time.Time{}
		c.sh.counts[queue] = sc
	}
	c.sh.mu.Unlock()
}

// layout returns the keys of every shard of queue in a queue of n shards, built
// once per Client.
func (c *Client) layout(queue string, n int) ([]Keys, error) {
	l := shardLayout{queue, n}
	c.sh.mu.RLock()
	ks, ok := c.sh.layouts[l]
	c.sh.mu.RUnlock()
	if ok {
		return ks, nil
	}
	ks = make([]Keys, n)
	for i := range ks {
		k, err := ShardKeys(c.cfg.Prefix, queue, i, n)
		if err != nil {
			return nil, err
		}
		ks[i] = k
	}
	c.sh.mu.Lock()
	if c.sh.layouts == nil {
		c.sh.layouts = map[shardLayout][]Keys{}
	}
	c.sh.layouts[l] = ks
	c.sh.mu.Unlock()
	return ks, nil
}

// shardsOf returns queue's shard count and the keys of its shards.
func (c *Client) shardsOf(ctx context.Context, queue string) ([]Keys, error) {
	n, err := c.Shards(ctx, queue)
	if err != nil {
		return nil, err
	}
	return c.layout(queue, n)
}

// routed returns the keys of every shard of queue in a queue of shards shards,
// or, for 0, of the count Redis holds (shardsOf).
func (c *Client) routed(ctx context.Context, queue string, shards int) ([]Keys, error) {
	if shards == 0 {
		return c.shardsOf(ctx, queue)
	}
	if shards < 0 || shards > MaxShards {
		return nil, fmt.Errorf("%w: %s: %d shards: 1..%d, or 0 for Redis's count", ErrInvalidArgument, queue, shards, MaxShards)
	}
	return c.layout(queue, shards)
}

// everyShard returns the keys of every shard of each of queues, and of[j], the
// index in queues of keys[j]'s queue.
func (c *Client) everyShard(ctx context.Context, queues []string) (keys []Keys, of []int, err error) {
	for i, q := range queues {
		l, err := c.shardsOf(ctx, q)
		if err != nil {
			return nil, nil, err
		}
		for _, k := range l {
			keys = append(keys, k)
			of = append(of, i)
		}
	}
	return keys, of, nil
}

// tokenBase is the token base of a claim from shard k of n: a shard's tokens name
// it ("<k>/<n>:<base>"), so that a lease is settled in its own shard. Shard 0 of
// an unsharded queue keeps the bare base.
func tokenBase(base string, k, n int) string {
	if n == 1 {
		return base
	}
	return strconv.Itoa(k) + "/" + strconv.Itoa(n) + ":" + base
}

// leaseKeys returns the keys of the shard that token's claim came from.
func (c *Client) leaseKeys(queue, token string) (Keys, error) {
	if err := checkToken(token); err != nil {
		return Keys{}, err
	}
	// A bare token is shard 0's of an unsharded queue. Its keys come from the
	// layout cache like a shard's: a batch of leases builds them once, not once
	// a lease.
	k, n := 0, 1
	if head, _, named := strings.Cut(token, ":"); named {
		ks, kn, ok := strings.Cut(head, "/")
		var err1, err2 error
		k, err1 = strconv.Atoi(ks)
		n, err2 = strconv.Atoi(kn)
		if !ok || err1 != nil || err2 != nil || n < 1 || n > MaxShards || k < 0 || k >= n {
			return Keys{}, fmt.Errorf("%w: lease token %q names no shard", ErrInvalidArgument, token)
		}
	}
	l, err := c.layout(queue, n)
	if err != nil {
		return Keys{}, err
	}
	return l[k], nil
}

// byShard groups the positions 0..count-1 by the shard of id(i) among len(l)
// shards, in order; a single shard gives one group of all.
func byShard(l []Keys, count int, id func(i int) string) map[int][]int {
	g := map[int][]int{}
	for i := range count {
		k := ShardOf(id(i), len(l))
		g[k] = append(g[k], i)
	}
	return g
}

// taskKeys returns the keys of the shard of task id of queue, after validating
// both.
func (c *Client) taskKeys(ctx context.Context, queue, id string) (Keys, error) {
	if err := validate.Queue(queue); err != nil {
		return Keys{}, err
	}
	if err := validate.TaskID(id); err != nil {
		return Keys{}, err
	}
	l, err := c.shardsOf(ctx, queue)
	if err != nil {
		return Keys{}, err
	}
	return l[ShardOf(id, len(l))], nil
}
