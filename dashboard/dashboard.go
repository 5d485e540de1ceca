// Package dashboard is delayq's operator web dashboard as an http.Handler, to mount
// in an application's own http.ServeMux (delayq ui serves the same handler on its
// own). Its pages: the queues (counts by state in PostgreSQL and in Redis, lags,
// an hour of throughput and claim lateness p50/p99 as charts, paused or not, with
// pause and resume), a queue's tasks with keyset pagination and filters, one task
// in both stores (cancel, reschedule, run now), the dead letters (retry, purge, or
// edit the payload and retry it as a new version), and a consistency check.
//
// Secure by default: every action needs authentication (Config.Token, typed into
// the login page or sent as "Authorization: Bearer", or HTTP basic credentials;
// compared in constant time) and a CSRF token, behind net/http's cross-origin
// protection; ReadOnly serves no action, HidePayloads shows no payload, AuthReads
// protects the pages too. Every value is HTML-escaped, no page has a script, and
// every response carries a strict Content-Security-Policy. Templates, stylesheet
// and charts (SVG drawn on the server) are embedded: it works offline.
//
// Mount it under a path with Config.BasePath and mux.Handle(base+"/", h), not under
// http.StripPrefix. docs/SECURITY.md, "The dashboard", says what to put in front
// of it before exposing it beyond the machine.
package dashboard

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/ui"
)

// ErrInvalidConfig reports a Config New refuses (errors.Is).
var ErrInvalidConfig = ui.ErrInvalidConfig

// Config configures the dashboard. Credentials are required unless ReadOnly.
type Config struct {
	// Token authenticates actions: at least 16 bytes.
	Token string
	// BasicUser and BasicPassword authenticate actions with HTTP basic auth.
	BasicUser, BasicPassword string
	// ReadOnly serves the pages without any action; no credentials needed.
	ReadOnly bool
	// HidePayloads never shows a payload (nor sends it to the browser).
	HidePayloads bool
	// AuthReads makes every page, not only the actions, need authentication.
	AuthReads bool

	// PayloadCap is the most payload bytes a task page shows. Default 16 KiB.
	PayloadCap int
	// PageSize is the rows of a list page. Default 50, at most 500.
	PageSize int
	// Refresh reloads the queues page this often. Default 0: never.
	Refresh time.Duration
	// BasePath is where the handler is mounted, without a trailing slash ("", the
	// default, for the root).
	BasePath string
	// Logger receives the errors of failed requests. Default: discard.
	Logger *slog.Logger
}

// New builds the dashboard on client's stores (its schema and key prefix). The
// error wraps ErrInvalidConfig for a Config it refuses.
func New(client *delayq.Client, cfg Config) (http.Handler, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: a nil client", ErrInvalidConfig)
	}
	dq, err := dispatch.On(client.Redis(), dispatch.Config{Prefix: client.Config().Prefix})
	if err != nil {
		return nil, err
	}
	return ui.New(ui.Config{
		DB: client.DB(), Redis: dq, Outbox: client.Outbox(),
		Token: cfg.Token, BasicUser: cfg.BasicUser, BasicPassword: cfg.BasicPassword,
		ReadOnly: cfg.ReadOnly, HidePayloads: cfg.HidePayloads, AuthReads: cfg.AuthReads,
		PayloadCap: cfg.PayloadCap, PageSize: cfg.PageSize, Refresh: cfg.Refresh,
		BasePath: cfg.BasePath, Logger: cfg.Logger, Schedules: client.Schedules,
	})
}
