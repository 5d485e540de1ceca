package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/forecast"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/outbox"
)

// startRelay runs delayq relay with args until the test ends and returns its
// admin URL.
func startRelay(t *testing.T, args ...string) string {
	t.Helper()
	dbURL := testenv.PostgresURL(t)
	_, prefix := testenv.Redis(t)
	env := map[string]string{"DATABASE_URL": dbURL, "REDIS_URL": testenv.RedisURL(t)}
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &relayOut{}, &relayOut{}
	done := make(chan int, 1)
	go func() {
		m := NewMain(stdout, stderr, func(k string) string { return env[k] })
		done <- m.Run(ctx, append([]string{"relay", "--listen", "127.0.0.1:0", "--prefix", prefix, "--log-format", "json"}, args...))
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("relay exited %d: %s", code, stderr.String())
		}
	})
	addrRE := regexp.MustCompile(`"admin":"(http://127\.0\.0\.1:\d+)"`)
	var admin string
	relayWaitFor(t, 30*time.Second, func() bool {
		if m := addrRE.FindStringSubmatch(stderr.String()); m != nil {
			admin = m[1]
			return true
		}
		return false
	})
	pool := testenv.Pool(t, dbURL)
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// 1,200 tasks due in two minutes: the relay moves them to Redis (its horizon
	// is an hour); the forecast counts them as queued rows.
	tasks := make([]outbox.Task, 1200)
	for i := range tasks {
		tasks[i] = outbox.Task{Queue: "reports", ID: fmt.Sprintf("r%04d", i), Payload: []byte("x"), Delay: 2*time.Minute + 10*time.Second}
	}
	if _, err := ob.EnqueueMany(context.Background(), pool, tasks); err != nil {
		t.Fatal(err)
	}
	return admin
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// delayq relay serves the forecast on its admin server: /forecast shaped for
// KEDA's metrics-api scaler (a 400 for a bad parameter) and the
// delayq_forecast_* metrics on /metrics, refreshed every --forecast-interval.
func TestRelayCommandForecast(t *testing.T) {
	t.Parallel()
	admin := startRelay(t, "--forecast-interval", "1s", "--forecast-handling-time", "2s", "--forecast-concurrency", "4")
	// The defaults of the command: lead 5m, and the flags' 2 s and 4 a worker:
	// 1,200 tasks in minute 2 are 40 busy slots, 10 workers.
	var r forecast.Response
	relayWaitFor(t, 30*time.Second, func() bool {
		code, body := httpGet(t, admin+"/forecast?queue=reports")
		if code != http.StatusOK {
			return false
		}
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatalf("/forecast: %v\n%s", err, body)
		}
		return r.Queues["reports"].Due["5m"] == 1200
	})
	if r.DesiredWorkers != 10 || r.Lead != "5m0s" || r.Handling != "2s" || r.Concurrency != 4 || r.Queues["reports"].Due["1m"] != 0 {
		t.Errorf("/forecast?queue=reports: %+v", r)
	}
	if code, body := httpGet(t, admin+"/forecast?queue=reports&lead=90"); code != http.StatusBadRequest ||
		!strings.Contains(body, `lead \"90\": want a positive duration`) {
		t.Errorf("?lead=90: %d %s", code, body)
	}
	code, body := httpGet(t, admin+"/metrics")
	for _, want := range []string{
		`delayq_forecast_due_tasks{horizon="5m",queue="reports"} 1200`,
		`delayq_forecast_due_tasks{horizon="1m",queue="reports"} 0`,
		`delayq_forecast_desired_workers{queue="reports"} 10`,
		"delayq_forecast_age_seconds ",
		"delayq_forecast_refresh_duration_seconds_count ",
		"delayq_forecast_refresh_errors_total 0",
	} {
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("/metrics: %d, lacks %q", code, want)
		}
	}
	if code, body := httpGet(t, admin+"/"); !strings.Contains(body, " /forecast") {
		t.Errorf("/: %d %q", code, body)
	}
}

// --forecast-interval 0 turns the forecast off: no endpoint, no metrics.
func TestRelayCommandForecastOff(t *testing.T) {
	t.Parallel()
	admin := startRelay(t, "--forecast-interval", "0")
	if code, _ := httpGet(t, admin+"/forecast"); code != http.StatusNotFound {
		t.Errorf("/forecast: %d, want 404", code)
	}
	if _, body := httpGet(t, admin+"/metrics"); strings.Contains(body, "delayq_forecast_") {
		t.Errorf("/metrics has the forecast's metrics")
	}
}

func TestRelayCommandForecastFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--forecast-interval", "-1s"}, "--forecast-interval -1s: at least 1s, or 0 for off"},
		{[]string{"--forecast-interval", "10ms"}, "--forecast-interval 10ms"},
		{[]string{"--forecast-lead", "30s"}, "--forecast-lead 30s: 1m..60m"},
		{[]string{"--forecast-lead", "2h"}, "--forecast-lead 2h0m0s: 1m..60m"},
		{[]string{"--forecast-handling-time", "0"}, "--forecast-handling-time 0s: 1ms..1h"},
		{[]string{"--forecast-concurrency", "0"}, "--forecast-concurrency 0: 1..100000"},
	} {
		code, stdout, stderr := runRelayCmd(context.Background(), nil, tc.args...)
		if code != exitUsage || !strings.Contains(stderr.String(), tc.want) || strings.Count(stderr.String(), "\n") != 1 || stdout.String() != "" {
			t.Errorf("%v: exit %d, stderr %q; want a usage error with %q", tc.args, code, stderr.String(), tc.want)
		}
	}
	help := commandHelp(t, "relay")
	for name, def := range map[string]string{"forecast-interval": "30s", "forecast-lead": "5m0s", "forecast-handling-time": "1s", "forecast-concurrency": "10"} {
		if got := flagDefault(t, help, name); got != def {
			t.Errorf("--%s default %q, want %q", name, got, def)
		}
	}
}
