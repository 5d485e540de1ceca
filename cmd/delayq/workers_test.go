package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/delayqtype"
)

// TestWorkersCommand lists a live process with a run in flight and a lost one,
// as a table and as JSON; an empty registry says so.
func TestWorkersCommand(t *testing.T) {
	t.Parallel()
	b := newCLIBundle(t)
	ctx := context.Background()
	b.run(t, "workers", "--prefix", b.prefix).want(t, exitOK, "no workers")
	b.run(t, "workers", "--prefix", b.prefix, "--json").want(t, exitOK, "[]")

	live := delayqtype.Worker{ID: "aaaa000000000001", Host: "web-1", PID: 4242, Version: "v1.4.0",
		Queues: map[string]int{"payment": 4, "emails": 10}, InFlight: 1}
	live.Running = append(live.Running, struct {
		Queue     string    `json:"queue"`
		ID        string    `json:"id"`
		Attempt   int       `json:"attempt"`
		ClaimedAt time.Time `json:"claimed_at"`
	}{Queue: "payment", ID: "order-1001", Attempt: 2, ClaimedAt: time.Now().Add(-3 * time.Second)})
	if _, err := b.dq.BeatWorker(ctx, live, time.Hour, time.Hour); err != nil {
		t.Fatal(err)
	}
	lost := delayqtype.Worker{ID: "bbbb000000000002", Host: "web-2", PID: 7, Version: "v1.4.0", Queues: map[string]int{"emails": 10}}
	if _, err := b.dq.BeatWorker(ctx, lost, time.Millisecond, time.Hour); err != nil {
		t.Fatal(err)
	}
	for { // its 1 ms lease passes by the Redis clock
		ws, err := b.dq.Workers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ws) == 2 && ws[1].Lost {
			break
		}
	}

	r := b.run(t, "workers", "--prefix", b.prefix)
	t.Log("\n" + r.stdout)
	r.want(t, exitOK, "ID", "HOST", "STATUS", "IN-FLIGHT", "emails:10,payment:4", "WORKER")
	lines := strings.Split(r.stdout, "\n")
	var liveLine, lostLine, runLine string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, live.ID) && strings.Contains(l, "web-1"):
			liveLine = l
		case strings.HasPrefix(l, lost.ID):
			lostLine = l
		case strings.HasPrefix(l, live.ID) && strings.Contains(l, "order-1001"):
			runLine = l
		}
	}
	if !strings.Contains(liveLine, "4242") || !strings.Contains(liveLine, "running") || !strings.HasSuffix(strings.TrimSpace(liveLine), "1") {
		t.Errorf("live worker line %q", liveLine)
	}
	if !strings.Contains(lostLine, "lost") || !strings.Contains(lostLine, "web-2") {
		t.Errorf("lost worker line %q", lostLine)
	}
	if f := strings.Fields(runLine); len(f) != 5 || f[1] != "payment" || f[3] != "2" || !strings.HasSuffix(f[4], "s") {
		t.Errorf("run line %q, want worker, payment, order-1001, attempt 2, for ~3s", runLine)
	}

	r = b.run(t, "workers", "--prefix", b.prefix, "--json")
	r.want(t, exitOK)
	var ws []delayqtype.Worker
	if err := json.Unmarshal([]byte(r.stdout), &ws); err != nil {
		t.Fatalf("JSON: %v\n%s", err, r.stdout)
	}
	if len(ws) != 2 || ws[0].ID != live.ID || ws[0].Lost || ws[0].Running[0].ID != "order-1001" || !ws[1].Lost {
		t.Errorf("JSON workers %+v", ws)
	}
	for _, key := range []string{`"last_beat"`, `"lost_at"`, `"in_flight": 1`, `"claimed_at"`, `"payment": 4`} {
		if !strings.Contains(r.stdout, key) {
			t.Errorf("JSON lacks %s:\n%s", key, r.stdout)
		}
	}
	b.run(t, "workers", "--prefix", b.prefix, "extra").want(t, exitUsage)
}
