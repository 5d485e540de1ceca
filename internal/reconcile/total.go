package reconcile

import (
	"slices"
	"strings"

	"github.com/delayq/delayq/delayqtype"
)

// TotalStats sums the stats of several databases: each queue's over the
// databases, in queue order, and every queue into one. Counts are added, the
// ages are the largest, and a sum is estimated if any part is. `delayq stats
// --database` and the dashboard's overview both show it.
func TotalStats(per [][]QueueStats) (queues []QueueStats, all QueueStats) {
	byQueue := map[string]*QueueStats{}
	all = QueueStats{Postgres: map[delayqtype.State]int64{}}
	for _, st := range per {
		for _, s := range st {
			t := byQueue[s.Queue]
			if t == nil {
				t = &QueueStats{Queue: s.Queue, Postgres: map[delayqtype.State]int64{}}
				byQueue[s.Queue] = t
			}
			addStats(t, s)
			addStats(&all, s)
		}
	}
	queues = make([]QueueStats, 0, len(byQueue))
	for _, t := range byQueue {
		queues = append(queues, *t)
	}
	slices.SortFunc(queues, func(a, b QueueStats) int { return strings.Compare(a.Queue, b.Queue) })
	return queues, all
}

// addStats adds s into t (t.Postgres not nil).
func addStats(t *QueueStats, s QueueStats) {
	for st, n := range s.Postgres {
		t.Postgres[st] += n
	}
	t.Estimated = t.Estimated || s.Estimated
	t.Ready += s.Ready
	t.DueNow += s.DueNow
	t.Active += s.Active
	t.ExpiredLeases += s.ExpiredLeases
	t.Dead += s.Dead
	t.Overdue += s.Overdue
	t.OldestPendingAge = max(t.OldestPendingAge, s.OldestPendingAge)
	t.OldestDueLateness = max(t.OldestDueLateness, s.OldestDueLateness)
}
