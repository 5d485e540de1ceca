package delayq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
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
		out[i] = Epoch{Shard: k.shard, Key: k.key, Value: v}
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
		out[i] = Epoch{Shard: k.shard, Key: k.key, Value: v}
	}
	return out, nil
}

type epochKey struct{ shard, key string }

// epochKeys names the mark of each master: on a single server "<prefix>:epoch";
// on a Cluster "<prefix>:{e<n>}:epoch" with the smallest n whose hash tag falls in
// the first slot range of each master.
func (c *Client) epochKeys(ctx context.Context) ([]epochKey, error) {
	cc, ok := c.rdb.(*redis.ClusterClient)
	if !ok {
		return []epochKey{{shard: "0", key: c.cfg.Prefix + ":epoch"}}, nil
	}
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("delayq: cluster slots: %w", err)
	}
	// A master may serve several ranges: its mark goes into the first one.
	first := map[string]redis.ClusterSlot{}
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			continue
		}
		id := s.Nodes[0].ID
		if f, ok := first[id]; !ok || s.Start < f.Start {
			first[id] = s
		}
	}
	var out []epochKey
	for _, s := range first {
		for n := 0; ; n++ {
			tag := "e" + strconv.Itoa(n)
			if slot := int(crc16([]byte(tag)) % 16384); slot >= s.Start && slot <= s.End {
				out = append(out, epochKey{shard: strconv.Itoa(s.Start), key: c.cfg.Prefix + ":{" + tag + "}:epoch"})
				break
			}
			if n > 1_000_000 {
				return nil, fmt.Errorf("delayq: no hash tag for slots %d-%d", s.Start, s.End)
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
