package relay

import (
	"slices"
	"testing"

	"github.com/delayq/delayq/internal/dispatch"
)

// TestMarksDiffer: what a loss check, the marks written at a repair's end, and a
// term's start each take for a loss.
func TestMarksDiffer(t *testing.T) {
	e := func(shard, value, node string) dispatch.Epoch {
		return dispatch.Epoch{Shard: shard, Key: "k" + shard, Value: value, Node: node}
	}
	known := []dispatch.Epoch{e("0", "m0", "a"), e("5461", "", "b"), e("10923", "m2", "c")}
	for _, tc := range []struct {
		name          string
		now           []dispatch.Epoch
		written       bool
		lost, changed []string
	}{
		{"unchanged", known, false, nil, nil},
		{"a mark gone", []dispatch.Epoch{e("0", "", "a"), e("5461", "", "b"), e("10923", "m2", "c")}, false, []string{"0"}, nil},
		{"another mark", []dispatch.Epoch{e("0", "m9", "a"), e("5461", "", "b"), e("10923", "m2", "c")}, false, []string{"0"}, nil},
		{"a failover keeping the mark", []dispatch.Epoch{e("0", "m0", "a"), e("5461", "", "b"), e("10923", "m2", "z")}, false, nil, []string{"10923"}},
		{"a new shard", append(slices.Clone(known), e("16000", "m3", "d")), false, []string{"16000"}, nil},
		// A missing mark found written is a loss to a check (another writer)...
		{"a missing mark written, checked", []dispatch.Epoch{e("0", "m0", "a"), e("5461", "m1", "b"), e("10923", "m2", "c")}, false, []string{"5461"}, nil},
		// ...and the repair's own mark when the repair wrote it.
		{"a missing mark written by the repair", []dispatch.Epoch{e("0", "m0", "a"), e("5461", "m1", "b"), e("10923", "m2", "c")}, true, nil, nil},
		// A failover between the pass's last check and its marks: the repair's
		// marks land on the promoted node, which must not hide it.
		{"a failover before the repair's marks", []dispatch.Epoch{e("0", "m0", "a"), e("5461", "m1", "y"), e("10923", "m2", "c")}, true, nil, []string{"5461"}},
		{"a lost mark at the repair's end", []dispatch.Epoch{e("0", "m7", "a"), e("5461", "m1", "b"), e("10923", "m2", "c")}, true, []string{"0"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lost, changed := marksDiffer(known, tc.now, tc.written)
			if !slices.Equal(lost, tc.lost) || !slices.Equal(changed, tc.changed) {
				t.Errorf("lost %v changed %v, want %v and %v", lost, changed, tc.lost, tc.changed)
			}
		})
	}
}
