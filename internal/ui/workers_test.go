package ui

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
)

// TestWorkersPage: a real worker whose handler blocks is listed with its queues
// and the task it runs (linked to the task's page); a process that stopped
// beating shows as lost, its fields escaped; the nav links the page; a worker
// that stops is gone at the next load.
func TestWorkersPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	c := e.client(t)
	if _, body := c.get("/workers"); !strings.Contains(body, `id="no-workers"`) {
		t.Fatalf("empty registry:\n%s", body)
	}
	if _, body := c.get("/"); !strings.Contains(body, `href="/workers">Workers</a>`) {
		t.Error("the nav does not link the workers page")
	}

	rl, err := relay.New(e.pool, e.dq.AsRedis(), relay.Config{PollInterval: 50 * time.Millisecond, ReapInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w, err := clientkit.NewClient(e.pool, e.dq, e.ob, delayq.WorkerConfig{Lease: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}, 1), make(chan struct{})
	if err := w.Handle("reports", func(ctx context.Context, _ *delayq.Task) error {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}, delayq.QueueConfig{Concurrency: 5}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = rl.Run(ctx) })
	wg.Go(func() { _ = w.Run(ctx) })
	stop := sync.OnceFunc(func() { close(release); cancel(); wg.Wait() })
	t.Cleanup(stop)
	e.enqueue(t, outbox.Task{Queue: "reports", ID: "nightly-7", Payload: []byte(`{}`)})
	<-started

	lost := delayqtype.Worker{ID: "0000dead0000beef", Host: `<script>alert(1)</script>`, PID: 9, Version: "v0.9.0",
		Queues: map[string]int{"emails": 10}}
	if _, err := e.dq.BeatWorker(ctxT(t), lost, time.Millisecond, time.Hour); err != nil {
		t.Fatal(err)
	}
	var body string
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, body = c.get("/workers")
		if strings.Contains(body, `data-run="reports/nightly-7"`) && strings.Contains(body, `data-status="lost"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the workers page never showed the run and the lost process:\n%s", body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, want := range []string{
		`data-live="1"`, `data-lost="1"`, `data-in-flight="1"`,
		`data-status="running"`, `data-queue="reports"`, `(5)`,
		`<span class="badge lost"`, `href="/task?queue=reports&amp;id=nightly-7">nightly-7</a>`,
		`&lt;script&gt;alert(1)&lt;/script&gt;`, `<h1>Workers</h1>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("workers page lacks %q", want)
		}
	}
	if strings.Contains(strings.ToLower(body), "<script") {
		t.Errorf("unescaped markup:\n%s", body)
	}
	if _, body := c.get("/workers?refresh=5"); !strings.Contains(body, `<meta http-equiv="refresh" content="5">`) {
		t.Error("no refresh")
	}

	stop()
	if _, body = c.get("/workers"); strings.Contains(body, `data-status="running"`) || !strings.Contains(body, `id="no-runs"`) {
		t.Errorf("after the worker stopped:\n%s", body)
	}
}
