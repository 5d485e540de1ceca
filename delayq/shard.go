package delayq

import (
	"fmt"
	"strconv"
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
