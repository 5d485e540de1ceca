package dispatch

import (
	"errors"
	"strconv"
	"testing"
)

func TestShardOf(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1} {
		if got := ShardOf("order-1", n); got != 0 {
			t.Errorf("ShardOf(_, %d) = %d, want 0", n, got)
		}
	}
	// FNV-1a of "a" is 0xe40c292c; the routing must never change for a stored task.
	if got := ShardOf("a", 1000); got != 0xe40c292c%1000 {
		t.Errorf("ShardOf(a, 1000) = %d, want %d", got, 0xe40c292c%1000)
	}
	const n, ids = 8, 80000
	var counts [n]int
	for i := range ids {
		counts[ShardOf("order-"+strconv.Itoa(i), n)]++
	}
	for k, c := range counts {
		if c < ids/n*9/10 || c > ids/n*11/10 {
			t.Errorf("shard %d has %d of %d ids: not within 10%% of even", k, c, ids)
		}
	}
}

func TestShardKeys(t *testing.T) {
	t.Parallel()
	k0, err := KeysFor("dq", "payment")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ShardKeys("dq", "payment", 0, 4); err != nil || got != k0 {
		t.Errorf("shard 0 = %+v, %v; want the queue's own keys", got, err)
	}
	for _, shards := range []int{2, 3, 5, 16, MaxShards} {
		seen := map[string]bool{hashTag(k0.Ready): true}
		slot0 := int(crc16([]byte("payment")) % slots)
		for k := 1; k < shards; k++ {
			ks, err := ShardKeys("dq", "payment", k, shards)
			if err != nil {
				t.Fatal(err)
			}
			tag := hashTag(ks.Ready)
			if seen[tag] {
				t.Fatalf("%d shards: tag %q twice", shards, tag)
			}
			seen[tag] = true
			for _, key := range []string{ks.Active, ks.Dead, ks.Priority, ks.TaskKey("x"), ks.Control, ks.History + "1"} {
				if hashTag(key) != tag {
					t.Errorf("%s: hash tag %q, want %q", key, hashTag(key), tag)
				}
			}
			if ks.Wake != k0.Wake {
				t.Errorf("shard %d wakes on %q, want %q", k, ks.Wake, k0.Wake)
			}
			// Each shard's slot is in its window: k/shards of the slot space on from
			// shard 0's, within a quarter window.
			off := (int(crc16([]byte(tag))%slots) - slot0 + slots) % slots
			if lo := k * (slots / shards); off < lo || off >= lo+max(1, slots/shards/4) {
				t.Errorf("%d shards: shard %d at offset %d, want %d..%d", shards, k, off, lo, lo+slots/shards/4)
			}
		}
	}
	for _, tc := range []struct{ k, shards int }{{0, 0}, {-1, 2}, {2, 2}, {0, MaxShards + 1}} {
		if _, err := ShardKeys("dq", "payment", tc.k, tc.shards); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ShardKeys(%d of %d) = %v, want ErrInvalidArgument", tc.k, tc.shards, err)
		}
	}
	if _, err := ShardKeys("dq", "a#1", 1, 2); !errors.Is(err, ErrInvalidQueue) {
		t.Errorf("queue a#1: %v, want ErrInvalidQueue", err)
	}
}
