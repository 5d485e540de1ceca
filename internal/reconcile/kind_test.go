package reconcile

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
)

// TestClassify covers the decisions the scenario tests do not reach.
func TestClassify(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	queued := &row{State: stateQueued, Version: 2, Attempt: 1, MaxAttempts: 3}
	for _, c := range []struct {
		name string
		r    *row
		p    dispatch.Probe
		kind Kind
		op   dispatch.RepairOp
	}{
		{"ready in two ZSETs", queued, dispatch.Probe{State: dispatch.StateReady, Version: 2, InReady: true, InDead: true},
			StatusMismatch, dispatch.RepairRestore},
		{"active also in ready keeps its lease", queued, dispatch.Probe{State: dispatch.StateActive, Version: 2, InReady: true, InActive: true},
			StatusMismatch, dispatch.RepairExpire},
		{"active without its member", queued, dispatch.Probe{State: dispatch.StateActive, Version: 2},
			HashWithoutMember, dispatch.RepairExpire},
		{"done with a member", &row{State: stateDone}, dispatch.Probe{State: dispatch.StateDone, InReady: true},
			StatusMismatch, dispatch.RepairRemove},
		{"dead in both, not in the dead ZSET", &row{State: stateDead}, dispatch.Probe{State: dispatch.StateDead},
			HashWithoutMember, dispatch.RepairRemove},
		{"dead in Redis, no time of death", queued, dispatch.Probe{State: dispatch.StateDead, Version: 2},
			DeadInRedis, dispatch.RepairRestore},
		{"newer version in Redis", queued, dispatch.Probe{State: dispatch.StateReady, Version: 3, InReady: true},
			VersionMismatch, dispatch.RepairRestore},
		{"cancelled with a done record", &row{State: stateCancelled}, dispatch.Probe{State: dispatch.StateDone}, "", 0},
		{"no row, done record", nil, dispatch.Probe{State: dispatch.StateDone}, "", 0},
		{"no row, nothing", nil, dispatch.Probe{}, "", 0},
	} {
		v := classify(c.r, c.p, now, time.Minute)
		if v.kind != c.kind || v.op != c.op {
			t.Errorf("%s: %q %v, want %q %v", c.name, v.kind, v.op, c.kind, c.op)
		}
	}
	// Restores keep the larger attempt count, but leave the task a run.
	for _, c := range []struct {
		p    dispatch.Probe
		want int
	}{
		{dispatch.Probe{Version: 2, Attempt: 2}, 2},
		{dispatch.Probe{Version: 2, Attempt: 9}, 2},
		{dispatch.Probe{Version: 1, Attempt: 2}, 1},
		{dispatch.Probe{}, 1},
	} {
		if got := restoreTask(queued, c.p).Attempt; got != c.want {
			t.Errorf("restore attempt with %+v: %d, want %d", c.p, got, c.want)
		}
	}
}

// The JSON of a Report and of QueueStats carries durations as whole milliseconds
// (one field each in Go, no paired fields), and reads back.
func TestDurationsInJSON(t *testing.T) {
	rep := Report{Rows: 3, Duration: 1500 * time.Millisecond}
	b, err := json.Marshal(rep)
	if err != nil || !strings.Contains(string(b), `"duration_ms":1500`) || !strings.Contains(string(b), `"postgres_rows":3`) {
		t.Fatalf("report JSON %s %v", b, err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil || back.Duration != rep.Duration || back.Rows != 3 {
		t.Errorf("report read back %+v %v", back, err)
	}
	qs := QueueStats{Queue: "q", OldestPendingAge: 2 * time.Second, OldestDueLateness: 3 * time.Millisecond}
	b, err = json.Marshal(qs)
	if err != nil || !strings.Contains(string(b), `"oldest_pending_age_ms":2000`) || !strings.Contains(string(b), `"oldest_due_lateness_ms":3`) {
		t.Fatalf("stats JSON %s %v", b, err)
	}
	var qback QueueStats
	if err := json.Unmarshal(b, &qback); err != nil || qback.OldestPendingAge != qs.OldestPendingAge || qback.OldestDueLateness != qs.OldestDueLateness || qback.Queue != "q" {
		t.Errorf("stats read back %+v %v", qback, err)
	}
}
