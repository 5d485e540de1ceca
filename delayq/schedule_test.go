package delayq_test

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/relay"
	"github.com/delayq/delayq/schedule"
)

// ping is a queue of empty values: a raw schedule of it needed Payload "{}",
// which the strict decoder of its handler takes and an empty payload is not.
var ping = outbox.Queue[struct{}]{Name: "ping"}

// tickLog records the ticks a handler ran, by task id.
type tickLog struct {
	mu   sync.Mutex
	runs map[string]int
	ch   chan string
}

func newTickLog() *tickLog { return &tickLog{runs: map[string]int{}, ch: make(chan string, 1000)} }

func (l *tickLog) record(id string) {
	l.mu.Lock()
	l.runs[id]++
	l.mu.Unlock()
	l.ch <- id
}

// ran returns a copy of the runs by task id: the handler goes on recording.
func (l *tickLog) ran() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.runs)
}

// wait waits for n ticks to run.
func (l *tickLog) wait(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(time.Minute)
	for range n {
		select {
		case <-l.ch:
		case <-timeout:
			t.Fatalf("%d ticks ran within a minute, want %d", len(l.ran()), n)
		}
	}
}

// runClient runs c until the test ends, and checks that Run ends well.
func runClient(t *testing.T, c *delayq.Client) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// A typed schedule of a Queue[struct{}], declared beside its handler on a
// client that runs the relay too: each tick reaches the typed handler (its
// payload "{}" by the queue's codec, with no Payload to get right).
func TestScheduleTyped(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t, testenv.PostgresURL(t))
	rdb, prefix := testenv.Redis(t)
	client, err := delayq.New(pool, rdb, delayq.Config{Prefix: prefix, Relay: &relay.Config{PollInterval: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ticks := newTickLog()
	if err := delayq.Register(client, ping, func(_ context.Context, tk *delayq.Task, _ struct{}) error {
		ticks.record(tk.ID)
		return nil
	}, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	s, err := schedule.For(ping, struct{}{}, schedule.Schedule{Name: "ping", Every: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if s.Queue != ping.Name || string(s.Payload) != "{}" {
		t.Fatalf("For: queue %q, payload %q", s.Queue, s.Payload)
	}
	if err := client.Schedule(s); err != nil {
		t.Fatal(err)
	}
	runClient(t, client)
	ticks.wait(t, 3)
	stats, err := client.Stats(context.Background(), ping.Name)
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != 1 || stats[0].Dead != 0 {
		t.Fatalf("stats %+v: a tick died", stats)
	}
	for id := range ticks.ran() {
		if name, _, ok := schedule.ParseTaskID(id); !ok || name != "ping" {
			t.Fatalf("task %q is not a tick of ping", id)
		}
	}
}

// checked is a payload with a Validate method.
type checked struct{ N int }

func (c checked) Validate() error {
	if c.N <= 0 {
		return errors.New("N must be positive")
	}
	return nil
}

// A schedule is checked where it is declared: an invalid value (its Validate),
// a Payload of its own, another queue's name, a bad schedule, a name declared
// twice, all refused, and nothing written.
func TestScheduleDeclarationRefused(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t, testenv.PostgresURL(t))
	rdb, prefix := testenv.Redis(t)
	q := outbox.Queue[checked]{Name: "checked"}
	every := schedule.Schedule{Name: "c", Every: time.Second}

	_, err := schedule.For(q, checked{N: 0}, every)
	if !errors.Is(err, schedule.ErrInvalid) || !errors.Is(err, outbox.ErrInvalidPayload) {
		t.Errorf("Validate refusal: %v, want ErrInvalid and ErrInvalidPayload", err)
	}
	for name, s := range map[string]schedule.Schedule{
		"payload":     {Name: "c", Every: time.Second, Payload: []byte("{}")},
		"other queue": {Name: "c", Queue: "other", Every: time.Second},
		"no timing":   {Name: "c"},
		"bad name":    {Name: "c c", Every: time.Second},
	} {
		if _, err := schedule.For(q, checked{N: 1}, s); !errors.Is(err, schedule.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}

	client, err := delayq.New(pool, rdb, delayq.Config{Prefix: prefix, Relay: &relay.Config{
		Schedules: schedule.Config{Schedules: []schedule.Schedule{{Name: "r", Queue: "checked", Every: time.Second, Payload: []byte(`{"N":1}`)}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	good, err := schedule.For(q, checked{N: 1}, every)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Schedule(good, good); !errors.Is(err, schedule.ErrInvalid) {
		t.Errorf("a name twice in one call: %v", err)
	}
	if err := client.Schedule(good); err != nil {
		t.Fatal(err)
	}
	if err := client.Schedule(good); !errors.Is(err, schedule.ErrInvalid) {
		t.Errorf("a name declared before: %v", err)
	}
	// The relay's schedule: the same declaration is run by the relay alone, a
	// different one refused.
	same, err := schedule.For(q, checked{N: 1}, schedule.Schedule{Name: "r", Every: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Schedule(same); err != nil {
		t.Errorf("the relay's schedule, identical: %v", err)
	}
	differs, err := schedule.For(q, checked{N: 2}, schedule.Schedule{Name: "r2", Every: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	differs.Name = "r"
	if err := client.Schedule(differs); !errors.Is(err, schedule.ErrInvalid) {
		t.Errorf("the relay's schedule, different: %v", err)
	}
	states, err := client.Schedules(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(states) != 2 || states[0].Name != "c" || states[1].Name != "r" || states[0].LastTick != nil || !states[0].UpdatedAt.IsZero() {
		t.Fatalf("declared schedules: %+v", states)
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM delayq_outbox) + (SELECT count(*) FROM delayq_schedules)`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows written (%v), want none", n, err)
	}
}

// A schedule declared on a client that runs no relay (the relay is a sidecar,
// or not started yet) ticks all the same: its worker enqueues the ticks into
// the outbox; here no relay moves them on.
func TestScheduleWithoutRelay(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t, testenv.PostgresURL(t))
	rdb, prefix := testenv.Redis(t)
	client, err := delayq.New(pool, rdb, delayq.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	s, err := schedule.For(ping, struct{}{}, schedule.Schedule{Name: "alone", Every: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Schedule(s); err != nil {
		t.Fatal(err)
	}
	runClient(t, client)
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM delayq_outbox WHERE queue = 'ping' AND task_id LIKE 'alone@%' AND payload = '{}'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no tick enqueued within a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
	states, err := client.Schedules(context.Background())
	if err != nil || len(states) != 1 || states[0].LastTick == nil || states[0].Enqueued == 0 {
		t.Fatalf("schedules %+v (%v)", states, err)
	}
}

// The same schedule declared in Go, beside the handler (the worker runs it),
// and in the YAML of a sidecar relay: each tick is enqueued and handled once.
func TestScheduleInGoAndYAML(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	pool := testenv.Pool(t, url)
	rdb, prefix := testenv.Redis(t)
	client, err := delayq.New(pool, rdb, delayq.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	ticks := newTickLog()
	if err := delayq.Register(client, ping, func(_ context.Context, tk *delayq.Task, _ struct{}) error {
		ticks.record(tk.ID)
		return nil
	}, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	s, err := schedule.For(ping, struct{}{}, schedule.Schedule{Name: "both", Every: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Schedule(s); err != nil {
		t.Fatal(err)
	}
	yaml, err := schedule.Parse([]byte("schedules:\n  - name: both\n    queue: ping\n    every: 200ms\n    payload: '{}'\n"))
	if err != nil {
		t.Fatal(err)
	}
	rl, err := relay.New(testenv.Pool(t, url), rdb, relay.Config{Prefix: prefix, Schedules: yaml, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay Run: %v", err)
		}
	})
	runClient(t, client)
	ticks.wait(t, 10)

	for id, n := range ticks.ran() {
		if n != 1 {
			t.Errorf("tick %s ran %d times", id, n)
		}
	}
	var rows, ids int
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT run_at) FROM delayq_outbox WHERE queue = 'ping'`).Scan(&rows, &ids); err != nil {
		t.Fatal(err)
	}
	if rows != ids {
		t.Errorf("%d tasks for %d ticks", rows, ids)
	}
}
