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
// Several outbox databases (docs/DESIGN.md, "Several databases"): New(nil, cfg)
// with Config.Databases serves one dashboard over them, an overview of every
// database's queues and their total at BasePath/, and each database's own
// dashboard, every page and action, at BasePath/db/KEY/.
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

	// Databases, when set, makes New (called with a nil client) serve one
	// dashboard over several outbox databases, one client each, named by the
	// client's own delayq.Config.Database key (required, each once): the key
	// that already places its tasks under PREFIX:KEY in Redis, so the page
	// that names a database cannot disagree with the keys it reads. The
	// overview, at BasePath/, lists each database's queues with their counts,
	// then each queue's total over the databases and the total of every queue
	// (a database that cannot be read shows its error and is named as left
	// out of the total); each database's own dashboard, every page and action
	// of New on that client, is at BasePath/db/KEY/. One login serves all of
	// them; the other fields apply to every database. At most 64 databases,
	// shown in this order. A field rather than a constructor of its own: one
	// New, one Config, and no name added to the package.
	Databases []*delayq.Client
}

// New builds the dashboard on client's stores (its schema and key prefix, under
// its Database key if it has one), or, with a nil client, over
// cfg.Databases. The error wraps ErrInvalidConfig for a Config it refuses,
// and for no client, a client beside Databases, or a database without a key
// or with a key given twice; nothing is served then.
func New(client *delayq.Client, cfg Config) (http.Handler, error) {
	ucfg := ui.Config{
		Token: cfg.Token, BasicUser: cfg.BasicUser, BasicPassword: cfg.BasicPassword,
		ReadOnly: cfg.ReadOnly, HidePayloads: cfg.HidePayloads, AuthReads: cfg.AuthReads,
		PayloadCap: cfg.PayloadCap, PageSize: cfg.PageSize, Refresh: cfg.Refresh,
		BasePath: cfg.BasePath, Logger: cfg.Logger,
	}
	if client == nil && len(cfg.Databases) == 0 {
		return nil, fmt.Errorf("%w: a nil client and no Databases", ErrInvalidConfig)
	}
	if client != nil && len(cfg.Databases) > 0 {
		return nil, fmt.Errorf("%w: a client and Databases: give one or the other", ErrInvalidConfig)
	}
	if client != nil {
		d, err := database(client)
		if err != nil {
			return nil, err
		}
		ucfg.DB, ucfg.Redis, ucfg.Outbox, ucfg.Schedules = d.DB, d.Redis, d.Outbox, d.Schedules
		h, err := ui.New(ucfg)
		if err != nil { // no typed nil in the interface
			return nil, err
		}
		return h, nil
	}
	dbs := make([]ui.Database, len(cfg.Databases))
	for i, c := range cfg.Databases {
		if c == nil {
			return nil, fmt.Errorf("%w: Databases[%d] is nil", ErrInvalidConfig, i)
		}
		if c.Config().Database == "" {
			return nil, fmt.Errorf("%w: Databases[%d] has no key: set its delayq.Config.Database", ErrInvalidConfig, i)
		}
		d, err := database(c)
		if err != nil {
			return nil, err
		}
		dbs[i] = d
	}
	h, err := ui.NewMulti(dbs, ucfg)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// database is what the dashboard reads of client: its pool, its Redis keys
// (under PREFIX:KEY for a client of several databases), its outbox.
func database(client *delayq.Client) (ui.Database, error) {
	cc := client.Config()
	dq, err := dispatch.On(client.Redis(), dispatch.Config{Prefix: dispatch.Namespace(cc.Prefix, cc.Database)})
	if err != nil {
		return ui.Database{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return ui.Database{Key: cc.Database, DB: client.DB(), Redis: dq, Outbox: client.Outbox(), Schedules: client.Schedules}, nil
}
