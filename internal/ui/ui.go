// Package ui is the operator's web dashboard of delayq: an http.Handler that shows
// the queues (counts by state in PostgreSQL and in Redis, lags), lists tasks with
// keyset pagination (by id, due, created or finished time) and searches them by a
// field of their JSON payload, within a row and a time limit (search.go), shows one
// task in both stores, lists dead letters and the worker processes with the runs
// each has in flight (from their heartbeats in Redis, dispatch's Workers), and runs
// the operator's actions (cancel, reschedule, run now, retry and purge dead tasks,
// a consistency check) through the project's own APIs: outbox.Cancel and
// Reschedule, reconcile.RetryDead, PurgeDeadTask and PurgeDead, reconcile.Stats
// and Reconcile (dry run), and a schedule's pause, resume and run now through
// schedrun.Actions. Bulk actions (bulk.go) run the same operations on
// the tasks ticked on a list or on every task matching its filter, after a
// preview, in batches. Reads come from PostgreSQL through internal/taskstate
// (the dashboard has no SQL of its own) and from Redis through package delayq.
//
// Secure by default: every action needs authentication (a token, through a login
// form that sets a session cookie or an Authorization: Bearer header, or HTTP
// basic credentials, compared in constant time), carries a CSRF token and passes
// net/http's cross-origin protection; ReadOnly serves no action at all and
// HidePayloads shows no payload. Templates are html/template (every value
// escaped), the pages carry no inline script (there is no script at all), and
// every response has a strict Content-Security-Policy and the other security
// headers. Templates and the stylesheet are embedded: the dashboard works
// offline.
package ui

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/queuectl"
	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/schedrun"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/transition"
	"github.com/delayq/delayq/outbox"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// ErrInvalidConfig reports a Config New refuses.
var ErrInvalidConfig = errors.New("ui: invalid config")

// Config configures the dashboard.
type Config struct {
	// DB is PostgreSQL (*pgxpool.Pool), Redis the delayq client, Outbox the
	// producer client whose Config names the schema. All three are required.
	DB     reconcile.DB
	Redis  *dispatch.Client
	Outbox *outbox.Client

	// Token authenticates actions: typed into the login form (which sets a
	// session cookie) or sent as "Authorization: Bearer <token>".
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
	// Refresh reloads the queues page this often (0: never); ?refresh=N
	// overrides it per page.
	Refresh time.Duration
	// Schedules, when set, lists the schedules on the Schedules page: those of
	// the database and those declared in the serving process that no runner
	// ran yet (dashboard.New: the client's Schedules), which can then be paused
	// before their first tick. Nil: the database's alone.
	Schedules func(context.Context) ([]delayqtype.ScheduleState, error)
	// BasePath is where the handler is mounted, without a trailing slash ("" for
	// the root). The handler expects the full path: mount it with
	// mux.Handle(base+"/", h), not under http.StripPrefix.
	BasePath string
	Logger   *slog.Logger
}

// Handler is the dashboard.
type Handler struct {
	cfg     Config
	browse  *taskstate.Browse
	deps    *taskstate.Deps      // the task page's dependencies (workflow.go)
	queues  *queuectl.Controller // the pause and resume actions
	sched   *schedrun.Actions    // the schedules' pause, resume and run now
	ops     *transition.Ops      // the bulk retry and purge (bulk.go)
	opts    reconcile.Options
	tmpl    map[string]*template.Template
	mux     *http.ServeMux
	csrfKey []byte
	session string // the session cookie's value for Token
	cop     *http.CrossOriginProtection

	mu        sync.Mutex
	lastCheck *checkResult

	// Set by NewMulti on a database's own dashboard (multi.go): its key,
	// shown on every page, and the overview's path, where the session cookie
	// lives (one login for every database). Both "" on a dashboard of its own.
	dbKey, home string
}

const (
	defaultPayloadCap = 16 << 10
	defaultPageSize   = 50
	cookieName        = "delayq_ui"
)

// New builds the dashboard.
func New(cfg Config) (*Handler, error) {
	if cfg.DB == nil || cfg.Redis == nil || cfg.Outbox == nil {
		return nil, fmt.Errorf("%w: DB, Redis and Outbox are required", ErrInvalidConfig)
	}
	h, err := newBase(cfg)
	if err != nil {
		return nil, err
	}
	ocfg := cfg.Outbox.Config()
	tcfg := taskstate.Config{Schema: ocfg.Schema, NotifyChannel: ocfg.NotifyChannel}
	h.browse, h.deps = taskstate.NewBrowser(tcfg), taskstate.NewDepsReader(tcfg)
	h.opts = reconcile.Options{Schema: ocfg.Schema, NotifyChannel: ocfg.NotifyChannel}
	h.sched = schedrun.NewActions(cfg.Outbox)
	h.ops = transition.New(taskstate.New(tcfg), cfg.Redis)
	if h.queues, err = queuectl.New(cfg.DB, cfg.Redis, ocfg.Schema); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	h.routes()
	return h, nil
}

// newBase checks cfg's credentials and options and builds what every page
// needs, stores apart: the templates, the CSRF key, the session.
func newBase(cfg Config) (*Handler, error) {
	if !cfg.ReadOnly && cfg.Token == "" && cfg.BasicUser == "" {
		return nil, fmt.Errorf("%w: actions need a Token or basic credentials (or ReadOnly)", ErrInvalidConfig)
	}
	if cfg.BasicUser != "" && cfg.BasicPassword == "" || cfg.BasicUser == "" && cfg.BasicPassword != "" {
		return nil, fmt.Errorf("%w: basic auth needs both a user and a password", ErrInvalidConfig)
	}
	if cfg.Token != "" && len(cfg.Token) < 16 {
		return nil, fmt.Errorf("%w: Token of %d bytes: at least 16", ErrInvalidConfig, len(cfg.Token))
	}
	if cfg.AuthReads && cfg.Token == "" && cfg.BasicUser == "" {
		return nil, fmt.Errorf("%w: AuthReads needs a Token or basic credentials", ErrInvalidConfig)
	}
	if cfg.BasePath != "" && (!strings.HasPrefix(cfg.BasePath, "/") || strings.HasSuffix(cfg.BasePath, "/")) {
		return nil, fmt.Errorf("%w: BasePath %q: starts with '/' and does not end with one", ErrInvalidConfig, cfg.BasePath)
	}
	if cfg.PayloadCap <= 0 {
		cfg.PayloadCap = defaultPayloadCap
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = defaultPageSize
	}
	cfg.PageSize = min(cfg.PageSize, 500)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: cfg, csrfKey: make([]byte, 32), cop: http.NewCrossOriginProtection()}
	if _, err := rand.Read(h.csrfKey); err != nil {
		return nil, err
	}
	if cfg.Token != "" {
		h.session = mac([]byte(cfg.Token), "delayq-ui-session-v1")
	}
	var err error
	if h.tmpl, err = parseTemplates(); err != nil {
		return nil, err
	}
	return h, nil
}

func mac(key []byte, msg string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}

func (h *Handler) routes() {
	b := h.cfg.BasePath
	mux := h.baseMux()
	mux.HandleFunc("GET "+b+"/{$}", h.reads(h.queuesPage))
	mux.HandleFunc("GET "+b+"/tasks", h.reads(h.tasksPage))
	mux.HandleFunc("GET "+b+"/task", h.reads(h.taskPage))
	mux.HandleFunc("GET "+b+"/dead", h.reads(h.deadPage))
	mux.HandleFunc("GET "+b+"/consistency", h.reads(h.consistencyPage))
	mux.HandleFunc("GET "+b+"/workers", h.reads(h.workersPage))
	mux.HandleFunc("GET "+b+"/schedules", h.reads(h.schedulesPage))
	if !h.cfg.ReadOnly {
		for name, fn := range map[string]func(http.ResponseWriter, *http.Request, *page){
			"cancel": h.actCancel, "reschedule": h.actReschedule, "run-now": h.actRunNow,
			"retry": h.actRetry, "purge": h.actPurge, "retry-all": h.actRetryAll, "purge-all": h.actPurgeAll,
			"check": h.actCheck, "pause": h.actPause(true), "resume": h.actPause(false), "edit-retry": h.actEditRetry,
			"schedule-pause": h.actSchedulePause(true), "schedule-resume": h.actSchedulePause(false), "schedule-run": h.actScheduleRun,
			"bulk": h.actBulk, "bulk-run": h.actBulkRun,
		} {
			mux.HandleFunc("POST "+b+"/action/"+name, h.action(fn))
		}
	}
	h.mux = mux
}

// baseMux serves what every dashboard has, stores apart: the stylesheet and
// icon, and the login and logout.
func (h *Handler) baseMux() *http.ServeMux {
	b := h.cfg.BasePath
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	fileServer := http.StripPrefix(b+"/static/", http.FileServer(http.FS(static)))
	mux.Handle("GET "+b+"/static/", fileServer)
	mux.HandleFunc("GET "+b+"/favicon.ico", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, b+"/static/favicon.svg", http.StatusMovedPermanently)
	})
	mux.HandleFunc("GET "+b+"/login", h.loginPage)
	mux.HandleFunc("POST "+b+"/login", h.login)
	mux.HandleFunc("POST "+b+"/logout", h.logout)
	return mux
}

// cookiePath is where the session cookie lives: the dashboard's own path, or
// the overview's when it is one database's of several (one login for all).
func (h *Handler) cookiePath() string {
	if h.home != "" {
		return h.home
	}
	return h.cfg.BasePath + "/"
}

// ServeHTTP serves the dashboard with its security headers, behind net/http's
// cross-origin protection.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.headers(w, r)
	h.cop.Handler(h.mux).ServeHTTP(w, r)
}

// headers sets the security headers of every response.
func (h *Handler) headers(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; "+
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	hd.Set("Cross-Origin-Resource-Policy", "same-origin")
	hd.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=()")
	if !strings.HasPrefix(r.URL.Path, h.cfg.BasePath+"/static/") {
		hd.Set("Cache-Control", "no-store")
	}
}

// principal names who is authenticated ("" for nobody): "token" or "basic:user".
// A bearer header is reported apart: it needs no CSRF token (a browser never
// adds it by itself).
func (h *Handler) principal(r *http.Request) (who string, bearer bool) {
	if h.cfg.Token != "" {
		if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") {
			if equal(strings.TrimPrefix(a, "Bearer "), h.cfg.Token) {
				return "token", true
			}
			return "", false
		}
		if c, err := r.Cookie(cookieName); err == nil && equal(c.Value, h.session) {
			return "token", false
		}
	}
	if h.cfg.BasicUser != "" {
		if u, p, ok := r.BasicAuth(); ok {
			// Both compared, always: no early exit tells which was wrong.
			uok, pok := equal(u, h.cfg.BasicUser), equal(p, h.cfg.BasicPassword)
			if uok && pok {
				return "basic:" + u, false
			}
		}
	}
	return "", false
}

// equal compares in constant time (for strings of the same length; the length
// itself is not secret: sha256 first makes it so).
func equal(a, b string) bool {
	x, y := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(x[:], y[:]) == 1
}

func (h *Handler) csrfFor(who string) string {
	if who == "" {
		return ""
	}
	return mac(h.csrfKey, "csrf:"+who)
}

// challenge answers an unauthenticated request: basic auth asks the browser,
// a token goes to the login form.
func (h *Handler) challenge(w http.ResponseWriter, r *http.Request) {
	if h.cfg.BasicUser != "" && h.cfg.Token == "" {
		w.Header().Set("WWW-Authenticate", `Basic realm="delayq", charset="UTF-8"`)
		http.Error(w, "authentication required", http.StatusUnauthorized)
		return
	}
	if r.Method == http.MethodGet {
		http.Redirect(w, r, h.cfg.BasePath+"/login", http.StatusSeeOther)
		return
	}
	http.Error(w, "authentication required: log in first", http.StatusUnauthorized)
}

// reads wraps a page: authentication only with AuthReads.
func (h *Handler) reads(fn func(http.ResponseWriter, *http.Request, *page)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		who, _ := h.principal(r)
		if h.cfg.AuthReads && who == "" {
			h.challenge(w, r)
			return
		}
		fn(w, r, h.newPage(r, who))
	}
}

// action wraps an action: authentication and the CSRF token, always.
func (h *Handler) action(fn func(http.ResponseWriter, *http.Request, *page)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// Room for an edited payload (url-encoded, up to 3 bytes a byte).
		r.Body = http.MaxBytesReader(w, r.Body, int64(max(64<<10, 3*h.cfg.Outbox.Config().MaxPayloadBytes+16<<10)))
		who, bearer := h.principal(r)
		if who == "" {
			h.challenge(w, r)
			return
		}
		if err := r.ParseForm(); err != nil {
			http.Error(w, "bad form", http.StatusBadRequest)
			return
		}
		if !bearer && !hmac.Equal([]byte(r.PostForm.Get("csrf")), []byte(h.csrfFor(who))) {
			http.Error(w, "invalid or missing CSRF token: reload the page and try again", http.StatusForbidden)
			return
		}
		fn(w, r, h.newPage(r, who))
	}
}

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	who, _ := h.principal(r)
	p := h.newPage(r, who)
	if h.cfg.BasicUser != "" && h.cfg.Token == "" && who == "" {
		h.challenge(w, r)
		return
	}
	p.Title = "Log in"
	h.render(w, p, "login", nil)
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	if h.cfg.Token == "" {
		http.Error(w, "no token login configured", http.StatusNotFound)
		return
	}
	if err := r.ParseForm(); err != nil || !equal(r.PostForm.Get("token"), h.cfg.Token) {
		p := h.newPage(r, "")
		p.Title, p.Error = "Log in", "Wrong token."
		w.WriteHeader(http.StatusUnauthorized)
		h.render(w, p, "login", nil)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: h.session, Path: h.cookiePath(),
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode, MaxAge: 12 * 3600})
	http.Redirect(w, r, h.cfg.BasePath+"/", http.StatusSeeOther)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: h.cookiePath(),
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode, MaxAge: -1})
	http.Redirect(w, r, h.cfg.BasePath+"/", http.StatusSeeOther)
}
