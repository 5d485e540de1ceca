package forecast

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/delayq/delayq/internal/validate"
)

// Path is where the sidecar serves Handler.
const Path = "/forecast"

// Response is the endpoint's JSON. KEDA's metrics-api scaler reads one number
// of it at its valueLocation: desiredWorkers (of the queues asked, summed), or
// queues.<name>.desiredWorkers.
type Response struct {
	// At is the start of the forecast's first minute (RFC 3339), AgeSeconds how
	// old it is.
	At         time.Time `json:"at"`
	AgeSeconds float64   `json:"ageSeconds"`
	// The recommendation's parameters, the request's or the relay's defaults.
	Lead        string `json:"lead"`
	Handling    string `json:"handling"`
	Concurrency int    `json:"concurrency"`
	// DesiredWorkers is the sum of the queues' below.
	DesiredWorkers int64 `json:"desiredWorkers"`
	// Queues: those asked (?queue=, repeatable), each even when nothing is due
	// (zeros); without, every queue of the forecast.
	Queues map[string]QueueJSON `json:"queues"`
}

// QueueJSON is one queue of Response.
type QueueJSON struct {
	DesiredWorkers int64 `json:"desiredWorkers"`
	Paused         bool  `json:"paused"`
	// Ready is Redis's backlog (due, not claimed), Active the runs in progress,
	// OverduePending the due rows the relay has not moved yet.
	Ready          int64 `json:"ready"`
	Active         int64 `json:"active"`
	OverduePending int64 `json:"overduePending"`
	// OldestLatenessSeconds: how long the earliest ready task has been due.
	OldestLatenessSeconds float64 `json:"oldestLatenessSeconds"`
	// Due: the tasks due within 1m, 5m, 15m and 60m; PerMinute the 60 minutes.
	Due       map[string]int64 `json:"due"`
	PerMinute []int64          `json:"perMinute"`
}

type errorJSON struct {
	Error string `json:"error"`
}

// Handler serves GET Path: the last forecast as a Response, the recommendation
// computed with the request's parameters (the Config's for those it leaves
// out): queue (repeatable), lead (a Go duration, 1m..60m), handling (1ms..1h),
// concurrency (1..100000). A parameter that does not parse or is out of range,
// an unknown or repeated one, or a queue this relay does not forecast
// (Config.Queues) is 400 with the reason; no forecast yet, or one older than
// three intervals, is 503 (KEDA then applies its fallback).
func (f *Forecaster) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeJSON(w, http.StatusMethodNotAllowed, errorJSON{"GET only"})
			return
		}
		p, queues, err := ParseQuery(r.URL.Query(), f.cfg.Params, f.cfg.Queues)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, errorJSON{err.Error()})
			return
		}
		s, ok := f.Last()
		now := time.Now()
		switch {
		case !ok:
			writeJSON(w, http.StatusServiceUnavailable, errorJSON{"no forecast yet: the first refresh has not completed"})
			return
		case f.stale(&s, now):
			writeJSON(w, http.StatusServiceUnavailable, errorJSON{fmt.Sprintf(
				"the last forecast is %v old (refreshes fail: see delayq_forecast_refresh_errors_total and the relay's log)",
				now.Sub(s.At).Round(time.Second))})
			return
		}
		writeJSON(w, http.StatusOK, respond(&s, p, queues, now))
	})
}

// respond builds the Response of s for p and queues (nil: every queue of s).
func respond(s *Snapshot, p Params, queues []string, now time.Time) Response {
	out := Response{
		At: s.At.UTC(), AgeSeconds: max(now.Sub(s.At).Seconds(), 0),
		Lead: p.Lead.String(), Handling: p.Handling.String(), Concurrency: p.Concurrency,
		Queues: map[string]QueueJSON{},
	}
	add := func(q *Queue) {
		j := QueueJSON{
			DesiredWorkers: p.Workers(q), Paused: q.Paused,
			Ready: q.Ready, Active: q.Active, OverduePending: q.OverduePending,
			OldestLatenessSeconds: q.OldestLateness.Seconds(),
			Due:                   map[string]int64{}, PerMinute: slices.Clone(q.Due[:]),
		}
		for _, h := range horizons() {
			j.Due[h.label] = q.DueWithin(h.d)
		}
		out.Queues[q.Name] = j
		out.DesiredWorkers = addCapped(out.DesiredWorkers, j.DesiredWorkers)
	}
	if queues == nil {
		for i := range s.Queues {
			add(&s.Queues[i])
		}
		return out
	}
	for _, name := range queues {
		if _, done := out.Queues[name]; !done {
			q, _ := s.Queue(name)
			add(&q)
		}
	}
	return out
}

// addCapped is a + b for non-negative a and b, at most MaxInt64.
func addCapped(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// ParseQuery reads a request's parameters over def: the recommendation's
// Params and the queues asked (nil: none named). served limits the queues
// (nil: any). Its errors are the 400's messages. The manifests' check
// (deploy/kubernetes) runs it on the ScaledObject's URL.
func ParseQuery(v url.Values, def Params, served []string) (Params, []string, error) {
	p := def.WithDefaults()
	var queues []string
	for key, vals := range v {
		if key != "queue" && len(vals) > 1 {
			return p, nil, fmt.Errorf("parameter %s given %d times: once at most", key, len(vals))
		}
		val := vals[0]
		var err error
		switch key {
		case "queue":
			for _, q := range vals {
				if err := validate.Queue(q); err != nil {
					return p, nil, fmt.Errorf("queue %q: %v", q, err)
				}
				if served != nil && !slices.Contains(served, q) {
					return p, nil, fmt.Errorf("queue %q: not forecast by this relay (its --queues: %s)", q, strings.Join(served, ","))
				}
			}
			queues = vals
		case "lead":
			p.Lead, err = parseDuration(key, val)
		case "handling":
			p.Handling, err = parseDuration(key, val)
		case "concurrency":
			// 0 would mean the default: a request states a number.
			if p.Concurrency, err = strconv.Atoi(val); err != nil || p.Concurrency < 1 {
				err = fmt.Errorf("concurrency %q: want a whole number of tasks one worker runs at once, 1..%d", val, MaxConcurrency)
			}
		default:
			return p, nil, fmt.Errorf("unknown parameter %q: want queue, lead, handling or concurrency", key)
		}
		if err != nil {
			return p, nil, err
		}
	}
	if err := p.Validate(); err != nil {
		return p, nil, fmt.Errorf("%s", strings.TrimPrefix(err.Error(), ErrInvalidParams.Error()+": "))
	}
	return p, queues, nil
}

func parseDuration(key, val string) (time.Duration, error) {
	d, err := time.ParseDuration(val)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s %q: want a positive duration such as 90s, 5m or 250ms", key, val)
	}
	return d, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v) // the client went away
}
