package ui

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
)

// The queues page shows, for a queue with a cap per concurrency key, the runs of
// each key holding a slot (Redis's count), a key at its cap marked full; a
// queue without a cap shows nothing of it.
func TestQueuesPageShowsRunsPerKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := ctxT(t)
	if _, err := e.h.queues.SetKeyLimits(ctx, "tenants", 2, 0, 0); err != nil {
		t.Fatal(err)
	}
	var tasks []dispatch.Task
	for i := range 3 {
		tasks = append(tasks, dispatch.Task{ID: fmt.Sprintf("acme-%d", i), Key: "acme"})
	}
	tasks = append(tasks, dispatch.Task{ID: "globex-0", Key: "globex"})
	if _, err := e.dq.Enqueue(ctx, "tenants", tasks...); err != nil {
		t.Fatal(err)
	}
	if err := e.dq.Register(ctx, "plain"); err != nil {
		t.Fatal(err)
	}
	c := e.client(t)
	c.login()
	_, body := c.get("/")
	if !strings.Contains(body, `data-key-cap="2"`) || !strings.Contains(body, `data-key-runs="none"`) {
		t.Fatalf("before any claim: no empty runs-per-key line for the capped queue:\n%s", body)
	}
	cl, err := e.dq.Claim(ctx, "tenants", 10, time.Minute)
	if err != nil || len(cl.Tasks) != 3 {
		t.Fatalf("claim: %d tasks, %v; want 3 (acme at its cap of 2, globex 1)", len(cl.Tasks), err)
	}
	resp, body := c.get("/")
	if resp.StatusCode != 200 {
		t.Fatalf("%s\n%s", resp.Status, body)
	}
	for _, want := range []string{
		`<span class="badge full" data-key="acme" data-runs="2">acme 2</span>`,
		`<span class="badge" data-key="globex" data-runs="1">globex 1</span>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("queues page lacks %q", want)
		}
	}
	if strings.Index(body, `data-key="acme"`) > strings.Index(body, `data-key="globex"`) {
		t.Error("the busiest key is not listed first")
	}
	if n := strings.Count(body, "data-key-cap="); n != 1 {
		t.Errorf("%d queues show runs per key, want 1 (plain has no cap)", n)
	}
}
