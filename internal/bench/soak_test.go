package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/testenv"
)

func TestHistogramQuantile(t *testing.T) {
	t.Parallel()
	var h histogram
	if h.quantile(99) != 0 {
		t.Fatal("empty histogram: want 0")
	}
	for i := 1; i <= 1000; i++ {
		h.add(time.Duration(i) * time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 500 * time.Millisecond}, {99, 990 * time.Millisecond}, {100, time.Second}} {
		got := h.quantile(c.p)
		if got < c.want || float64(got) > float64(c.want)*1.0201 { // the bucket's upper edge: within 2 %
			t.Errorf("p%v = %v, want %v within its bucket", c.p, got, c.want)
		}
	}
	var m histogram
	m.add(5 * time.Second)
	m.merge(&h)
	if m.n != 1001 || m.quantile(100) != 5*time.Second {
		t.Errorf("merged: n %d, max %v", m.n, m.quantile(100))
	}
}

func TestOverlapped(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b int64
		want bool
	}{{0, 0, false}, {2, 2, false}, {1, 1, true}, {0, 1, true}, {1, 2, true}, {0, 2, true}} {
		if got := overlapped(c.a, c.b); got != c.want {
			t.Errorf("overlapped(%d, %d) = %v", c.a, c.b, got)
		}
	}
}

// TestSoakSamples runs a short soak with a retention short enough to prune during
// it, and checks that its samples come out as JSON lines that saw the outbox, the
// retention's passes (timed by the relay pool's tracer) and the worker's guards
// (timed by the worker pool's tracer).
func TestSoakSamples(t *testing.T) {
	t.Parallel()
	for _, group := range []int{0, 8} { // a commit a run; up to 8 runs a commit
		t.Run(fmt.Sprintf("group-commit-%d", group), func(t *testing.T) {
			t.Parallel()
			testSoakSamples(t, group)
		})
	}
}

func testSoakSamples(t *testing.T, group int) {
	var out bytes.Buffer
	env := Env{DatabaseURL: testenv.PostgresURL(t), RedisURL: testenv.OwnRedis(t).URL(), Soak: Soak{
		Rate: 100, Duration: 4 * time.Second, SampleEvery: time.Second, GroupCommit: group,
		Retention: time.Second, RetentionInterval: 500 * time.Millisecond, RetentionBatch: 10, Samples: &out}}
	res, err := Run(context.Background(), env, "soak")
	if err != nil {
		t.Fatal(err)
	}
	var (
		n                         int
		pruned, passes, guards    int64
		sized, indexed, batchTime bool
	)
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var smp soakSample
		if err := json.Unmarshal(sc.Bytes(), &smp); err != nil {
			t.Fatalf("sample %d: %v: %s", n, err, sc.Bytes())
		}
		n++
		pruned += smp.PruneRows
		passes += smp.PrunePasses
		guards += smp.GuardsPruning
		sized = sized || (smp.OutboxBytes > 0 && smp.OutboxHeapBytes > 0)
		indexed = indexed || smp.IndexBytes["pkey"] > 0 && smp.IndexBytes["done_at_idx"] > 0
		batchTime = batchTime || smp.PruneBatchMax > 0
		if smp.GuardP99 > 0 {
			guards++
		}
	}
	if n < 2 || pruned == 0 || passes == 0 || guards == 0 || !sized || !indexed || !batchTime {
		t.Errorf("%d samples: pruned %d rows in %d passes, guards timed %d, sized %v, indexed %v, batches timed %v\n%s",
			n, pruned, passes, guards, sized, indexed, batchTime, out.String())
	}
	if res.Checks["tasks"] == 0 || res.Checks["effects"] != res.Checks["tasks"] {
		t.Errorf("checks %v", res.Checks)
	}
}
