package dispatch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Loss detection. Each Redis master holds one epoch mark under the prefix: a random
// value written once (SET NX) and never changed. A master that restarted without
// persistence, was flushed, or failed over to a replica that never had the mark
// answers without it, or with another one: the caller (the relay) then knows that
// Redis lost data there and repairs it from Postgres. On a single server there is
// one mark; on a Cluster, one per master, each under a hash tag of one of that
// master's slots.

// Epoch is the mark of one master.
type Epoch struct {
	// Shard names the master by the first slot it serves ("0" on a single server):
	// stable across a failover, unlike its address.
	Shard string
	// Key is the mark's key; Value is "" when the master has no mark.
	Key, Value string
	// Node identifies the master serving the shard now: its run id on a single
	// server (new at every restart), its node id on a Cluster (new after a
	// failover). A replica promoted with the mark may still have lost the writes
	// it had not received: a caller repairs after any change of Node too.
	Node string
}

// Epochs reads the mark of every master, sorted by Shard.
func (c *Client) Epochs(ctx context.Context) ([]Epoch, error) {
	keys, err := c.epochKeys(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Epoch, len(keys))
	for i, k := range keys {
		v, err := c.rdb.Get(ctx, k.key).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("delayq: read epoch %s: %w", k.key, err)
		}
		out[i] = Epoch{Shard: k.shard, Key: k.key, Value: v, Node: k.node}
	}
	return out, nil
}

// RereadEpochs reads the marks of the given epochs again, one GET each, and
// returns them with their Shard, Key and Node as given: the cheap check between
// two Epochs, which also look at the topology and the masters' identity.
func (c *Client) RereadEpochs(ctx context.Context, known []Epoch) ([]Epoch, error) {
	out := slices.Clone(known)
	for i, e := range out {
		v, err := c.rdb.Get(ctx, e.Key).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("delayq: read epoch %s: %w", e.Key, err)
		}
		out[i].Value = v
	}
	return out, nil
}

// EnsureEpochs writes a fresh mark on every master that has none (SET NX: a mark
// another relay wrote first is kept), and returns the marks now in place.
func (c *Client) EnsureEpochs(ctx context.Context) ([]Epoch, error) {
	keys, err := c.epochKeys(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Epoch, len(keys))
	for i, k := range keys {
		var b [12]byte
		_, _ = rand.Read(b[:])
		fresh := strconv.FormatInt(time.Now().Unix(), 10) + "-" + hex.EncodeToString(b[:])
		v, err := c.rdb.SetArgs(ctx, k.key, fresh, redis.SetArgs{Mode: "NX", Get: true}).Result()
		switch {
		case errors.Is(err, redis.Nil):
			v = fresh // there was none: ours is in place
		case err != nil:
			return nil, fmt.Errorf("delayq: write epoch %s: %w", k.key, err)
		}
		out[i] = Epoch{Shard: k.shard, Key: k.key, Value: v, Node: k.node}
	}
	return out, nil
}

type epochKey struct{ shard, key, node string }

// epochKeys names the mark of each master: on a single server "<prefix>:epoch";
// on a Cluster "<prefix>:{e<n>}:epoch" with the smallest n whose hash tag falls in
// the first slot range of each master.
func (c *Client) epochKeys(ctx context.Context) ([]epochKey, error) {
	cc, ok := c.rdb.(*redis.ClusterClient)
	if !ok {
		info, err := c.rdb.Info(ctx, "server").Result()
		if err != nil {
			return nil, fmt.Errorf("delayq: server info: %w", err)
		}
		runID := ""
		for line := range strings.SplitSeq(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
				runID = v
			}
		}
		return []epochKey{{shard: "0", key: c.cfg.Prefix + ":epoch", node: runID}}, nil
	}
	shards, err := cc.ClusterShards(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("delayq: cluster shards: %w", err)
	}
	var out []epochKey
	for _, sh := range shards {
		if len(sh.Slots) == 0 {
			continue // a shard without slots holds no data
		}
		// A shard may serve several ranges: its mark goes into the first one.
		first := slices.MinFunc(sh.Slots, func(a, b redis.SlotRange) int { return int(a.Start - b.Start) })
		node := ""
		for _, n := range sh.Nodes {
			if n.Role == "master" {
				node = n.ID
			}
		}
		for n := 0; ; n++ {
			tag := "e" + strconv.Itoa(n)
			if slot := int64(crc16([]byte(tag)) % 16384); slot >= first.Start && slot <= first.End {
				out = append(out, epochKey{shard: strconv.FormatInt(first.Start, 10), key: c.cfg.Prefix + ":{" + tag + "}:epoch", node: node})
				break
			}
			if n > 1_000_000 {
				return nil, fmt.Errorf("delayq: no hash tag for slots %d-%d", first.Start, first.End)
			}
		}
	}
	slices.SortFunc(out, func(a, b epochKey) int {
		x, _ := strconv.Atoi(a.shard)
		y, _ := strconv.Atoi(b.shard)
		return x - y
	})
	return out, nil
}

// crc16 is the CRC16-CCITT (XMODEM) of Redis Cluster's key slots.
func crc16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc ^= uint16(c) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
