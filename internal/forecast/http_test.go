package forecast_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/forecast"
)

func get(t *testing.T, h http.Handler, target string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

// The endpoint on real PostgreSQL and Redis: the rows due (Postgres) and the
// backlog (Redis) in the JSON KEDA reads, per queue and summed; the request's
// parameters over the relay's; a clear 400 for each bad parameter; 503 before
// the first refresh and once the last one is stale.
func TestEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t, forecast.Config{Interval: time.Second})
	ctx := context.Background()
	h := b.f.Handler()
	if code, body := get(t, h, "/forecast"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no forecast yet") {
		t.Errorf("before the first refresh: %d %s", code, body)
	}

	at := time.Now()
	// reports: 30 tasks due now in Redis, 5 of them claimed (running); 1,200
	// rows due in minute 3 (Postgres).
	tasks := make([]dispatch.Task, 30)
	for i := range tasks {
		tasks[i] = dispatch.Task{ID: fmt.Sprintf("r%d", i), Payload: []byte("x"), RunAt: at.Add(-time.Second)}
	}
	// One more in Redis not due yet: not backlog.
	tasks = append(tasks, dispatch.Task{ID: "later", Payload: []byte("x"), RunAt: at.Add(2 * time.Minute)})
	if _, err := b.dq.Enqueue(ctx, "reports", tasks...); err != nil {
		t.Fatal(err)
	}
	if c, err := b.dq.Claim(ctx, "reports", 5, time.Minute); err != nil || len(c.Tasks) != 5 {
		t.Fatalf("claim: %v, %+v", err, c)
	}
	b.row(t, "reports", "queued", at.Add(3*time.Minute+time.Second), 1200)
	// mail: 60 rows due in minute 20.
	b.row(t, "mail", "pending", at.Add(20*time.Minute+time.Second), 60)
	if err := b.f.RefreshAt(ctx, at); err != nil {
		t.Fatal(err)
	}

	read := func(target string) forecast.Response {
		t.Helper()
		code, body := get(t, h, target)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", target, code, body)
		}
		var r forecast.Response
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatalf("GET %s: %v\n%s", target, err, body)
		}
		return r
	}
	// The defaults (lead 5m, 1 s a task, 10 a worker): reports needs 2 for its
	// 1,200 tasks in minute 3 (20 busy slots); its backlog of 25 needs 1.
	r := read("/forecast")
	rep := r.Queues["reports"]
	if r.DesiredWorkers != 2 || rep.DesiredWorkers != 2 || rep.Ready != 25 || rep.Active != 5 || rep.Paused ||
		rep.Due["1m"] != 0 || rep.Due["5m"] != 1200 || rep.Due["60m"] != 1200 || len(rep.PerMinute) != 60 || rep.PerMinute[3] != 1200 ||
		rep.OldestLatenessSeconds <= 0 || r.Lead != "5m0s" || r.Handling != "1s" || r.Concurrency != 10 || !r.At.Equal(at.Truncate(time.Microsecond)) {
		t.Errorf("every queue, defaults: %+v", r)
	}
	if m, ok := r.Queues["mail"]; !ok || m.DesiredWorkers != 0 || m.Due["15m"] != 0 || m.Due["60m"] != 60 {
		t.Errorf("mail: %+v (%v)", m, ok)
	}
	// A lead of 21 minutes takes mail's minute 20 in; a 6 s handler and 3 a
	// worker: reports 1,200·6/(60·3) = 40, mail 60·6/180 = 2.
	r = read("/forecast?lead=21m&handling=6s&concurrency=3")
	if r.DesiredWorkers != 42 || r.Queues["reports"].DesiredWorkers != 40 || r.Queues["mail"].DesiredWorkers != 2 || r.Lead != "21m0s" {
		t.Errorf("lead 21m, 6s, 3: %+v", r)
	}
	// One queue, as a ScaledObject asks (valueLocation desiredWorkers); a queue
	// with nothing is there with zeros, so KEDA reads 0, not an error.
	r = read("/forecast?queue=reports&handling=6s&concurrency=3")
	if r.DesiredWorkers != 40 || len(r.Queues) != 1 {
		t.Errorf("?queue=reports: %+v", r)
	}
	r = read("/forecast?queue=idle&queue=mail&queue=idle&lead=60m")
	if r.DesiredWorkers != 1 || len(r.Queues) != 2 || r.Queues["idle"].DesiredWorkers != 0 || len(r.Queues["idle"].PerMinute) != 60 {
		t.Errorf("?queue=idle&queue=mail: %+v", r)
	}

	for _, tc := range []struct{ query, want string }{
		{"lead=soon", `lead \"soon\": want a positive duration`},
		{"lead=30s", "lead 30s: want 1m..60m"},
		{"lead=2h", "lead 2h0m0s: want 1m..60m"},
		{"lead=-5m", "want a positive duration"},
		{"handling=0s", `handling \"0s\": want a positive duration`},
		{"handling=500us", "handling 500µs: want 1ms..1h"},
		{"concurrency=0", `concurrency \"0\": want a whole number`},
		{"concurrency=100001", "concurrency 100001: want 1..100000"},
		{"concurrency=ten", `concurrency \"ten\": want a whole number`},
		{"queue=not%20ok", `queue \"not ok\": `},
		{"queue=", `queue \"\": `},
		{"lead=5m&lead=6m", "parameter lead given 2 times"},
		{"workers=3", `unknown parameter \"workers\"`},
	} {
		code, body := get(t, h, "/forecast?"+tc.query)
		if code != http.StatusBadRequest || !strings.Contains(body, tc.want) || !strings.HasPrefix(body, `{"error":`) {
			t.Errorf("?%s: %d %s, want 400 with %q", tc.query, code, body, tc.want)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/forecast", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", rec.Code)
	}

	// A forecast three intervals old is refused: KEDA falls back.
	if err := b.f.RefreshAt(ctx, time.Now().Add(-4*time.Second)); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, h, "/forecast"); code != http.StatusServiceUnavailable || !strings.Contains(body, "old") {
		t.Errorf("stale: %d %s", code, body)
	}
}

// A relay limited to queues forecasts those alone, and refuses the others.
func TestEndpointQueues(t *testing.T) {
	t.Parallel()
	b := setup(t, forecast.Config{Queues: []string{"a", "b"}})
	b.row(t, "a", "queued", time.Now().Add(time.Minute), 1)
	b.row(t, "c", "queued", time.Now().Add(time.Minute), 1)
	if err := b.f.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	s, _ := b.f.Last()
	if len(s.Queues) != 2 || s.Queues[0].Name != "a" || s.Queues[0].DueWithin(time.Hour) != 1 || s.Queues[1].Name != "b" {
		t.Errorf("queues %+v, want a (1 due) and b", s.Queues)
	}
	if code, body := get(t, b.f.Handler(), "/forecast?queue=c"); code != http.StatusBadRequest || !strings.Contains(body, "not forecast by this relay") {
		t.Errorf("?queue=c: %d %s", code, body)
	}
}

// The metrics: due tasks by horizon and desired workers per queue, from the
// last refresh, and the refresh's own.
func TestMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	b := setup(t, forecast.Config{Registerer: reg})
	if n, err := testutil.GatherAndCount(reg, "delayq_forecast_due_tasks"); err != nil || n != 0 {
		t.Errorf("before a refresh: %d series (%v)", n, err)
	}
	at := time.Now()
	b.row(t, "q", "pending", at.Add(30*time.Second), 700)
	b.row(t, "q", "queued", at.Add(10*time.Minute), 5)
	if err := b.f.RefreshAt(context.Background(), at); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP delayq_forecast_desired_workers Workers a queue needs over the next lead time (the relay's --forecast-lead), by the relay's --forecast-handling-time and --forecast-concurrency: the most any minute needs (0 while paused).
# TYPE delayq_forecast_desired_workers gauge
delayq_forecast_desired_workers{queue="q"} 2
# HELP delayq_forecast_due_tasks Tasks due within the next horizon (1m, 5m, 15m, 60m) by queue: pending and queued outbox rows, not those due already; as of the last forecast refresh.
# TYPE delayq_forecast_due_tasks gauge
delayq_forecast_due_tasks{horizon="15m",queue="q"} 705
delayq_forecast_due_tasks{horizon="1m",queue="q"} 700
delayq_forecast_due_tasks{horizon="5m",queue="q"} 700
delayq_forecast_due_tasks{horizon="60m",queue="q"} 705
# HELP delayq_forecast_refresh_errors_total Forecast refreshes that failed (the last forecast is served meanwhile, until it is stale).
# TYPE delayq_forecast_refresh_errors_total counter
delayq_forecast_refresh_errors_total 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "delayq_forecast_due_tasks",
		"delayq_forecast_desired_workers", "delayq_forecast_refresh_errors_total"); err != nil {
		t.Error(err)
	}
	for _, name := range []string{"delayq_forecast_age_seconds", "delayq_forecast_refresh_duration_seconds"} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n != 1 {
			t.Errorf("%s: %d series (%v)", name, n, err)
		}
	}
}
