package dispatch

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayqtype"
)

// TestScriptsRejectMalformedArgs calls every script directly with malformed ARGV:
// each must answer with its own error reply and write nothing. The well-formed
// parts of each call name real tasks and tokens, so a script that skipped a check
// would change something.
func TestScriptsRejectMalformedArgs(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := ctxT(t)
	now := redisNow(t, b.rdb)
	b.enqueue(t,
		Task{ID: "act", RunAt: now.Add(-time.Second)},
		Task{ID: "dead", RunAt: now.Add(-time.Second)},
		Task{ID: "rdy", RunAt: now.Add(time.Hour)},
	)
	cl := b.claim(t, 2, time.Hour)
	if len(cl.Tasks) != 2 {
		t.Fatalf("claimed %d", len(cl.Tasks))
	}
	tok := cl.Tasks[0].Token // "act"
	if err := b.c.Kill(ctx, "q", "dead", cl.Tasks[1].Token, "x"); err != nil {
		t.Fatal(err)
	}
	b.rdb.ZAdd(ctx, b.k.Active, redisZ("act", 1)) // expired, so reap would act
	k, w := b.k, b.k.Wake
	long := strings.Repeat("e", 4097)
	// A task's 10 arguments (id, due, payload, max, attempt, version, trace, start_by,
	// priority, concurrency key), so that each case below fails on the field it names.
	task := func(id, due, max, attempt, ver string) []any {
		return []any{id, due, "payload", max, attempt, ver, "", "", "0", ""}
	}
	withPriority := func(p string) []any { t := task("n2", "now", "3", "0", "1"); t[8] = p; return t }
	cat := func(parts ...[]any) []any {
		var out []any
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	good := task("new", "now", "3", "0", "1")
	manyIDs := make([]any, 1001)
	for i := range manyIDs {
		manyIDs[i] = "id" + strconv.Itoa(i)
	}
	manyPairs := make([]any, 0, 2002)
	for range 1001 {
		manyPairs = append(manyPairs, "act", tok)
	}

	s := b.c.s
	probe, err := adminScript("probe")
	if err != nil {
		t.Fatal(err)
	}
	repair, err := adminScript("repair")
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := adminScript("ctl")
	if err != nil {
		t.Fatal(err)
	}
	restore := func(due, max, attempt, ver string) []any {
		return []any{"restore", "rdy", "fp", due, "payload", max, attempt, ver, "", "", "0", ""}
	}
	enq := []string{k.Ready, k.Active, k.TaskPrefix, k.Dead, k.Priority, k.Control, k.KeyPrefix}
	claimKeys := []string{k.Ready, k.Active, k.TaskPrefix, k.Control, k.History, k.Priority, k.KeyPrefix}
	lease := []string{k.Ready, k.Active, k.Dead, k.TaskPrefix, k.Priority, k.Control, k.KeyPrefix}
	done := []string{k.Active, k.TaskPrefix, k.History, k.Ready, k.Priority, k.Control, k.KeyPrefix}
	kill := []string{k.Active, k.Dead, k.TaskPrefix, k.Ready, k.Priority, k.Control, k.KeyPrefix}
	ctlKeys := []string{k.Control, k.Ready, k.Priority, k.TaskPrefix, k.KeyPrefix}
	withKey := func(key string) []any { t := task("n2", "now", "3", "0", "1"); t[9] = key; return t }
	// A registered worker process, which a malformed beat or goodbye must leave be.
	if _, err := b.c.BeatWorker(ctx, delayqtype.Worker{ID: "w1"}, time.Hour, time.Hour); err != nil {
		t.Fatal(err)
	}
	index, procs := WorkerKeys(b.prefix)
	reg := []string{index, procs}
	cases := []struct {
		name   string
		script *redis.Script
		keys   []string
		args   []any
	}{
		{"enqueue", s.enqueue, enq, nil},
		{"enqueue", s.enqueue, enq, cat([]any{w, "0", "0", "1"})},
		{"enqueue", s.enqueue, enq, cat([]any{w, "x", "0", "1"}, good)},
		{"enqueue", s.enqueue, enq, cat([]any{w, "1.0", "0", "1"}, good)},
		{"enqueue", s.enqueue, enq, cat([]any{w, "10001", "0", "1"}, good)},
		{"enqueue", s.enqueue, enq, cat([]any{"", "1", "0", "1"}, good)},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good)},
		{"enqueue", s.enqueue, enq, cat([]any{w, "1", "0", "1"}, good, []any{"extra"})},
		{"enqueue", s.enqueue, enq, cat([]any{w, "1", "0", "0"}, good)},
		{"enqueue", s.enqueue, enq, cat([]any{w, "1", "0", "65"}, good)},
		{"enqueue", s.enqueue, enq, cat([]any{w, "1", "0", "x"}, good)},
		{"enqueue", s.enqueue, enq, cat([]any{w, "1", "2", "1"}, good)},
		{"enqueue", s.enqueue, enq, cat([]any{w, "1", "", "1"}, good)},
		{"enqueue", s.enqueue, enq, cat([]any{w, "1", "0", "1"}, good[:6])},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, task("", "now", "3", "0", "1"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, task(strings.Repeat("i", 201), "now", "3", "0", "1"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, task("n2", "1e9", "3", "0", "1"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, task("n2", "-5", "3", "0", "1"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, task("n2", "inf", "3", "0", "1"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, task("n2", "nan", "3", "0", "1"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, task("n2", "0x10", "3", "0", "1"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, task("n2", "1.2345", "3", "0", "1"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, task("n2", "", "3", "0", "1"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, task("n2", "99999999999999", "3", "0", "1"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, task("n2", "now", "0", "0", "1"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, task("n2", "now", "1.5", "0", "1"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, task("n2", "now", "abc", "0", "1"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, task("n2", "now", "3", "-1", "1"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, task("n2", "now", "3", "0", "0"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, task("n2", "now", "3", "0", "2147483648"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, []any{"n2", "now", "payload", "3", "0", "1", strings.Repeat("c", 513), "", "0", ""})},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, withPriority("10"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, withPriority("-1"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, withPriority(""))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, withPriority("1.5"))},
		{"enqueue", s.enqueue, enq, cat([]any{w, "2", "0", "1"}, good, withKey(strings.Repeat("k", 201)))},

		{"claim", s.claim, claimKeys, nil},
		{"claim", s.claim, claimKeys, []any{"-1", "1000", "base"}},
		{"claim", s.claim, claimKeys, []any{"1001", "1000", "base"}},
		{"claim", s.claim, claimKeys, []any{"x", "1000", "base"}},
		{"claim", s.claim, claimKeys, []any{"1", "0", "base"}},
		{"claim", s.claim, claimKeys, []any{"1", "1.5", "base"}},
		{"claim", s.claim, claimKeys, []any{"1", "1099511627777", "base"}},
		{"claim", s.claim, claimKeys, []any{"1", "1000", ""}},
		{"claim", s.claim, claimKeys, []any{"1", "1000", strings.Repeat("b", 65)}},
		{"claim", s.claim, claimKeys, []any{"1", "1000", "base", "extra"}},

		{"extend", s.extend, []string{k.Active, k.TaskPrefix}, []any{"1000"}},
		{"extend", s.extend, []string{k.Active, k.TaskPrefix}, []any{"1000", "act"}},
		{"extend", s.extend, []string{k.Active, k.TaskPrefix}, []any{"0", "act", tok}},
		{"extend", s.extend, []string{k.Active, k.TaskPrefix}, []any{"-1", "act", tok}},
		{"extend", s.extend, []string{k.Active, k.TaskPrefix}, []any{"1e3", "act", tok}},
		{"extend", s.extend, []string{k.Active, k.TaskPrefix}, []any{"1099511627777", "act", tok}},
		{"extend", s.extend, []string{k.Active, k.TaskPrefix}, []any{"1000", "", tok}},
		{"extend", s.extend, []string{k.Active, k.TaskPrefix}, []any{"1000", "act", ""}},
		{"extend", s.extend, []string{k.Active, k.TaskPrefix}, []any{"1000", "act", strings.Repeat("t", 101)}},
		// A valid first pair does not get through when a later one is malformed.
		{"extend", s.extend, []string{k.Active, k.TaskPrefix}, []any{"1000", "act", tok, "act", ""}},
		{"extend", s.extend, []string{k.Active, k.TaskPrefix}, append([]any{"1000"}, manyPairs...)},

		{"complete", s.complete, done, []any{"1000", w}},
		{"complete", s.complete, done, []any{"1000", w, "act"}},
		{"complete", s.complete, done, []any{"x", w, "act", tok}},
		{"complete", s.complete, done, []any{"-1", w, "act", tok}},
		{"complete", s.complete, done, []any{"1099511627777", w, "act", tok}},
		{"complete", s.complete, done, []any{"1000", w, "", tok}},
		{"complete", s.complete, done, []any{"1000", w, "act", strings.Repeat("t", 101)}},
		// A valid first pair does not get through when a later one is malformed.
		{"complete", s.complete, done, []any{"1000", w, "act", tok, "act", ""}},
		{"complete", s.complete, done, append([]any{"1000", w}, manyPairs...)},
		{"complete", s.complete, done, []any{"1000", "", "act", tok}},

		{"retry", s.retry, lease, []any{w, "act", tok, "1000"}},
		{"retry", s.retry, lease, []any{"", "act", tok, "1000", "e"}},
		{"retry", s.retry, lease, []any{w, "act", tok, "0", "e"}},
		{"retry", s.retry, lease, []any{w, "act", tok, "abc", "e"}},
		{"retry", s.retry, lease, []any{w, "act", tok, "1000", long}},
		{"retry", s.retry, lease, []any{w, "", tok, "1000", "e"}},
		{"retry", s.retry, lease, []any{w, "act", "", "1000", "e"}},

		{"kill", s.kill, kill, []any{"act", tok, "e"}},
		{"kill", s.kill, kill, []any{"act", tok, long, w}},
		{"kill", s.kill, kill, []any{"", tok, "e", w}},
		{"kill", s.kill, kill, []any{"act", "", "e", w}},
		{"kill", s.kill, kill, []any{"act", tok, "e", ""}},

		{"release", s.release, lease, []any{w, "act"}},
		{"release", s.release, lease, []any{"", "act", tok}},
		{"release", s.release, lease, []any{w, "", tok}},
		{"release", s.release, lease, []any{w, "act", ""}},
		{"release", s.release, lease, []any{w, "act", tok, "-1"}},
		{"release", s.release, lease, []any{w, "act", tok, "x"}},
		{"release", s.release, lease, []any{w, "act", tok, "0", "e"}},

		{"reap", s.reap, lease, []any{w, "10", "1000", "2000", "1"}},
		{"reap", s.reap, lease, []any{"", "10", "1000", "2000", "1", "e"}},
		{"reap", s.reap, lease, []any{w, "0", "1000", "2000", "1", "e"}},
		{"reap", s.reap, lease, []any{w, "10001", "1000", "2000", "1", "e"}},
		{"reap", s.reap, lease, []any{w, "x", "1000", "2000", "1", "e"}},
		{"reap", s.reap, lease, []any{w, "10", "0", "2000", "1", "e"}},
		{"reap", s.reap, lease, []any{w, "10", "1000", "999", "1", "e"}},
		{"reap", s.reap, lease, []any{w, "10", "1000", "2000", "1000000", "e"}},
		{"reap", s.reap, lease, []any{w, "10", "1000", "2000", "-1", "e"}},
		{"reap", s.reap, lease, []any{w, "10", "1000", "2000", "1", long}},

		{"remove", s.remove, lease, nil},
		{"remove", s.remove, lease, []any{""}},
		{"remove", s.remove, lease, []any{"rdy", "act"}},

		{"stats", s.stats, []string{k.Ready, k.Active, k.Dead}, []any{"x"}},

		{"inspect", s.inspect, lease, nil},
		{"inspect", s.inspect, lease, []any{"rdy", ""}},
		{"inspect", s.inspect, lease, manyIDs},

		{"ctl", ctl, ctlKeys, []any{w, "1", "1"}},
		{"ctl", ctl, ctlKeys, []any{w, "1", "1", "0", "1000", "1", "x", "0", "0", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "1", "1", "0", "1000", "1", "65", "0", "0", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "1", "1", "0", "1000", "1", "1", "0", "0", "1000", "extra"}},
		{"ctl", ctl, ctlKeys, []any{"", "1", "1", "0", "1000", "1", "1", "0", "0", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "0", "1", "0", "1000", "1", "1", "0", "0", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "-1", "1", "0", "1000", "1", "1", "0", "0", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "1.5", "1", "0", "1000", "1", "1", "0", "0", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "1000000000000000", "1", "0", "1000", "1", "1", "0", "0", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "1", "2", "0", "1000", "1", "1", "0", "0", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "1", "", "0", "1000", "1", "1", "0", "0", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "1", "1", "-1", "1000", "1", "1", "0", "0", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "1", "1", "1000000001", "1000", "1", "1", "0", "0", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "1", "1", "5", "0", "1", "1", "0", "0", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "1", "1", "5", "1.5", "1", "1", "0", "0", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "1", "1", "5", "1000", "0", "1", "0", "0", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "1", "1", "0", "1000", "1", "1", "-1", "0", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "1", "1", "0", "1000", "1", "1", "100001", "0", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "1", "1", "0", "1000", "1", "1", "1", "10001", "1000"}},
		{"ctl", ctl, ctlKeys, []any{w, "1", "1", "0", "1000", "1", "1", "1", "5", "0"}},
		{"ctl", ctl, ctlKeys, []any{w, "1", "1", "0", "1000", "1", "1", "1", "5", "x"}},

		{"workerbeat", s.workerBeat, reg, nil},
		{"workerbeat", s.workerBeat, reg, []any{"", "{}", "1000"}},
		{"workerbeat", s.workerBeat, reg, []any{strings.Repeat("w", 65), "{}", "1000"}},
		{"workerbeat", s.workerBeat, reg, []any{"w1", "", "1000"}},
		{"workerbeat", s.workerBeat, reg, []any{"w1", strings.Repeat("r", 65537), "1000"}},
		{"workerbeat", s.workerBeat, reg, []any{"w1", "{}", "0"}},
		{"workerbeat", s.workerBeat, reg, []any{"w1", "{}", "1.5"}},
		{"workerbeat", s.workerBeat, reg, []any{"w1", "{}", "1000", "extra"}},
		{"workerbye", s.workerBye, reg, nil},
		{"workerbye", s.workerBye, reg, []any{""}},
		{"workerbye", s.workerBye, reg, []any{"w1", "extra"}},
		{"workers", s.workers, reg, nil},
		{"workers", s.workers, reg, []any{"0"}},
		{"workers", s.workers, reg, []any{"10001"}},

		{"probe", probe, lease, nil},
		{"probe", probe, lease, []any{"rdy", ""}},
		{"probe", probe, lease, manyIDs},

		{"repair", repair, lease, []any{w, "0"}},
		{"repair", repair, lease, []any{w, "1"}},
		{"repair", repair, lease, cat([]any{"", "1"}, restore("now", "3", "0", "1"))},
		{"repair", repair, lease, cat([]any{w, "1"}, restore("soon", "3", "0", "1"))},
		{"repair", repair, lease, cat([]any{w, "1"}, restore("now", "0", "0", "1"))},
		{"repair", repair, lease, cat([]any{w, "1"}, restore("now", "3", "-1", "1"))},
		{"repair", repair, lease, cat([]any{w, "1"}, restore("now", "3", "0", "0"))},
		{"repair", repair, lease, cat([]any{w, "1"}, restore("now", "3", "0", "1")[:10], []any{"10", ""})},
		{"repair", repair, lease, cat([]any{w, "1"}, restore("now", "3", "0", "1")[:10], []any{"", ""})},
		{"repair", repair, lease, cat([]any{w, "1"}, restore("now", "3", "0", "1")[:8], []any{strings.Repeat("c", 513), "", "0", ""})},
		{"repair", repair, lease, cat([]any{w, "2"}, restore("now", "3", "0", "1"), []any{"frob", "rdy", "fp", "", "", "", "", "", "", "", "", ""})},
		{"repair", repair, lease, cat([]any{w, "1"}, []any{"remove", "", "fp", "", "", "", "", "", "", "", "", ""})},
		{"repair", repair, lease, cat([]any{w, "1"}, restore("now", "3", "0", "1")[:11], []any{strings.Repeat("k", 201)})},
	}
	snap := b.snapshot(t)
	for i, tc := range cases {
		_, err := tc.script.Run(ctx, b.rdb, tc.keys, tc.args...).Result()
		if err == nil || !strings.HasPrefix(err.Error(), "ERR delayq "+tc.name+": ") {
			t.Errorf("case %d (%s %v): got error %v, want the script's own error", i, tc.name, tc.args, err)
		}
	}
	sameSnapshot(t, "malformed calls", snap, b.snapshot(t))
}
