package validate

import (
	"errors"
	"math"
	"testing"
)

func TestShards(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n  int
		ok bool
	}{
		{1, true}, {2, true}, {16, true}, {MaxShards, true},
		{0, false}, {-1, false}, {MaxShards + 1, false}, {math.MaxInt, false}, {math.MinInt, false},
	} {
		err := Shards(tc.n)
		if tc.ok && err != nil {
			t.Errorf("Shards(%d) = %v, want nil", tc.n, err)
		}
		if !tc.ok && !errors.Is(err, ErrInvalidShards) {
			t.Errorf("Shards(%d) = %v, want ErrInvalidShards", tc.n, err)
		}
	}
}
