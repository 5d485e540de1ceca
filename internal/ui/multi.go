package ui

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// One dashboard over several outbox databases (docs/DESIGN.md, "Several
// databases"): an overview at BasePath/ lists every database's queues and the
// total, and each database has its own dashboard, every page and action of
// New, at BasePath/db/KEY/, on that database's stores. One login (the session
// cookie lives at the overview's path) serves them all; each database's
// dashboard keeps its own CSRF key, so a form of one is refused by another.

// Database is one outbox database of a dashboard over several.
type Database struct {
	// Key names the database (validate.Database): its dashboard is at
	// BasePath/db/KEY/.
	Key string
	// DB, Redis (on the database's namespace, PREFIX:KEY), Outbox and
	// Schedules are as Config's, for this database.
	DB        reconcile.DB
	Redis     *dispatch.Client
	Outbox    *outbox.Client
	Schedules func(context.Context) ([]delayqtype.ScheduleState, error)
}

// MaxDatabases bounds the databases of one dashboard: the overview reads each
// one at every load.
const MaxDatabases = 64

// Multi is the dashboard over several databases.
type Multi struct {
	root  *Handler // the overview's: credentials, templates, login
	dbs   []*Handler
	byKey map[string]*Handler
}

// NewMulti builds the dashboard over dbs, in their order, with cfg's
// credentials and options for every database (cfg's DB, Redis, Outbox and
// Schedules are each database's, so they must be unset).
func NewMulti(dbs []Database, cfg Config) (*Multi, error) {
	if len(dbs) == 0 {
		return nil, fmt.Errorf("%w: no database", ErrInvalidConfig)
	}
	if len(dbs) > MaxDatabases {
		return nil, fmt.Errorf("%w: %d databases, at most %d", ErrInvalidConfig, len(dbs), MaxDatabases)
	}
	if cfg.DB != nil || cfg.Redis != nil || cfg.Outbox != nil || cfg.Schedules != nil {
		return nil, fmt.Errorf("%w: DB, Redis, Outbox and Schedules are each database's: set them in Database", ErrInvalidConfig)
	}
	root, err := newBase(cfg)
	if err != nil {
		return nil, err
	}
	m := &Multi{root: root, byKey: map[string]*Handler{}}
	for i, d := range dbs {
		if err := validate.Database(d.Key); err != nil {
			return nil, fmt.Errorf("%w: database %d: key: %w", ErrInvalidConfig, i+1, err)
		}
		if m.byKey[d.Key] != nil {
			return nil, fmt.Errorf("%w: database key %q given twice", ErrInvalidConfig, d.Key)
		}
		c := cfg
		c.DB, c.Redis, c.Outbox, c.Schedules = d.DB, d.Redis, d.Outbox, d.Schedules
		c.BasePath = cfg.BasePath + "/db/" + d.Key
		h, err := New(c)
		if err != nil {
			return nil, fmt.Errorf("database %s: %w", d.Key, err)
		}
		h.dbKey, h.home = d.Key, cfg.BasePath+"/"
		m.dbs = append(m.dbs, h)
		m.byKey[d.Key] = h
	}
	mux := root.baseMux()
	mux.HandleFunc("GET "+cfg.BasePath+"/{$}", root.reads(m.overviewPage))
	root.mux = mux
	return m, nil
}

// ServeHTTP serves a database's pages with its own dashboard and the rest (the
// overview, the login) with the overview's; both set the security headers.
func (m *Multi) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if rest, ok := strings.CutPrefix(r.URL.Path, m.root.cfg.BasePath+"/db/"); ok {
		key, sub, slash := strings.Cut(rest, "/")
		if h := m.byKey[key]; h != nil {
			if !slash && sub == "" && r.Method == http.MethodGet { // BASE/db/KEY: its queues
				h.headers(w, r)
				http.Redirect(w, r, r.URL.Path+"/", http.StatusMovedPermanently)
				return
			}
			h.ServeHTTP(w, r)
			return
		}
	}
	m.root.ServeHTTP(w, r)
}

// overviewDB is one database's rows on the overview.
type overviewDB struct {
	Key    string
	Queues []overviewQueue
	Err    string // why its figures could not be read: not in the total
}

// overviewQueue is one queue of one database.
type overviewQueue struct {
	reconcile.QueueStats
	Paused bool
}

// overviewData is the overview: each database, then the total of each queue
// over the databases read, then of every queue.
type overviewData struct {
	Databases []overviewDB
	Total     []reconcile.QueueStats
	All       reconcile.QueueStats
	Missing   []string // the databases not in the total
}

func (m *Multi) overviewPage(w http.ResponseWriter, r *http.Request, p *page) {
	ctx, cancel := ctxOf(r)
	defer cancel()
	data := overviewData{Databases: make([]overviewDB, len(m.dbs))}
	var wg sync.WaitGroup
	for i, h := range m.dbs { // at once: a database that hangs costs its own timeout, not the others' sum
		wg.Go(func() {
			d := overviewDB{Key: h.dbKey}
			st, paused, _, err := h.queueStats(ctx)
			if err != nil {
				d.Err = err.Error()
				h.cfg.Logger.Warn("ui: overview", "database", h.dbKey, "err", err)
			}
			for _, s := range st {
				d.Queues = append(d.Queues, overviewQueue{s, paused[s.Queue]})
			}
			data.Databases[i] = d
		})
	}
	wg.Wait()
	var per [][]reconcile.QueueStats
	for _, d := range data.Databases {
		if d.Err != "" {
			data.Missing = append(data.Missing, d.Key)
			continue
		}
		st := make([]reconcile.QueueStats, len(d.Queues))
		for i, q := range d.Queues {
			st[i] = q.QueueStats
		}
		per = append(per, st)
	}
	data.Total, data.All = reconcile.TotalStats(per)
	p.Title, p.Overview = "Databases", true
	if len(data.Missing) > 0 {
		p.Error = "Not in the total, their figures unread: " + strings.Join(data.Missing, ", ") + "."
	}
	m.root.setRefresh(r, p)
	m.root.render(w, p, "overview", data)
}
