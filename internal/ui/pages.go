package ui

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/taskstate"
)

// page is what every template gets.
type page struct {
	Base, Title  string
	Who, CSRF    string
	User         string // the basic user of Who ("" for the token)
	CanAct       bool   // authenticated and not read-only
	ReadOnly     bool
	HidePayloads bool
	NeedsLogin   bool // actions exist and nobody is logged in
	TokenLogin   bool
	Refresh      int // seconds, 0 none
	Flash, Error string
	Now          time.Time
	Data         any
	// Several databases (multi.go): DB is the key of the database this page
	// is of, Home the overview's path ("" for a dashboard of its own), and
	// Overview marks the overview itself.
	DB, Home string
	Overview bool
}

// flashes are the messages an action's redirect may ask for (?ok=code): a fixed
// set, so that a link cannot put words of its own on the page.
var flashes = map[string]string{
	"cancelled": "Task cancelled.", "rescheduled": "Task rescheduled: the relay moves the new version.",
	"run-now": "Task due now: the relay moves it to Redis at once.", "retried": "Dead task retried as a new version.",
	"purged": "Dead task purged from both stores.", "retried-all": "Dead tasks retried.",
	"purged-all": "Dead tasks purged from both stores.", "checked": "Consistency check done.",
	"paused": "Queue paused: no worker claims from it until it is resumed.", "resumed": "Queue resumed.",
	"edited":           "Dead task retried with the edited payload, as a new version.",
	"schedule-paused":  "Schedule paused: no tick is enqueued until it is resumed; the ticks that fall meanwhile count as missed.",
	"schedule-resumed": "Schedule resumed: it goes on with its next tick; the ticks that fell while paused are not caught up.",
	"schedule-run":     "One tick enqueued now, as a task of its own: the schedule's last manual run.",
	"schedule-run-dup": "That run was enqueued already (the form was sent twice): still one task, the schedule's last manual run.",
}

func (h *Handler) newPage(r *http.Request, who string) *page {
	p := &page{
		Base: h.cfg.BasePath, Who: who, CSRF: h.csrfFor(who), User: strings.TrimPrefix(who, "basic:"),
		CanAct: who != "" && !h.cfg.ReadOnly, ReadOnly: h.cfg.ReadOnly, HidePayloads: h.cfg.HidePayloads,
		NeedsLogin: who == "" && !h.cfg.ReadOnly, TokenLogin: h.cfg.Token != "",
		Now: time.Now(), DB: h.dbKey, Home: h.home,
	}
	if msg, ok := flashes[r.URL.Query().Get("ok")]; ok {
		p.Flash = msg
	}
	return p
}

var funcs = template.FuncMap{
	// count is a queue's count of rows in a state: {{count .Postgres "dead"}}.
	"count": func(m map[delayqtype.State]int64, s delayqtype.State) int64 { return m[s] },
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "–"
		}
		return t.UTC().Format("2006-01-02 15:04:05.000Z")
	},
	"rel": func(t time.Time, now time.Time) string {
		if t.IsZero() {
			return ""
		}
		d := t.Sub(now)
		switch {
		case d > time.Second:
			return "in " + short(d)
		case d < -time.Second:
			return short(-d) + " ago"
		}
		return "now"
	},
	"dur": func(d time.Duration) string {
		if d <= 0 {
			return "–"
		}
		return short(d)
	},
	"bytes": func(n int) string {
		switch {
		case n >= 1<<20:
			return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
		case n >= 1<<10:
			return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
		}
		return fmt.Sprintf("%d B", n)
	},
}

func short(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func parseTemplates() (map[string]*template.Template, error) {
	out := map[string]*template.Template{}
	for _, name := range []string{"queues", "tasks", "task", "consistency", "login", "confirm", "error", "workers", "schedules", "notmigrated", "bulk", "overview"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("ui: template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

func (h *Handler) render(w http.ResponseWriter, p *page, name string, data any) {
	p.Data = data
	var buf bytes.Buffer
	if err := h.tmpl[name].Execute(&buf, p); err != nil {
		h.cfg.Logger.Error("ui: render", "page", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = buf.WriteTo(w)
}

// fail shows an error page; the message is escaped like everything else.
func (h *Handler) fail(w http.ResponseWriter, p *page, code int, err error) {
	if h.notMigrated(w, p, err) {
		return
	}
	if code >= 500 {
		h.cfg.Logger.Warn("ui: request failed", "err", err)
	}
	p.Title, p.Error = http.StatusText(code), err.Error()
	w.WriteHeader(code)
	h.render(w, p, "error", nil)
}

func ctxOf(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 30*time.Second)
}

// --- queues ---

type queueRow struct {
	reconcile.QueueStats
	// RedisLive is what Redis holds of live tasks (ready + active); Postgres's
	// queued rows should be there.
	RedisLive int64
	Agree     bool
	Note      string
	Total     int64
	// Paused is Postgres's flag (the truth); RedisPaused what the claim script
	// reads, which the relay mirrors within seconds.
	Paused, RedisPaused bool
	Hour                hourView
	HistoryErr          string
	// KeyCap is the queue's cap of runs per concurrency key (0: none); KeyRuns
	// the keys with runs holding a slot (Redis's count, what the claim checks),
	// busiest first; KeyRunsErr why they could not be read.
	KeyCap     int
	KeyRuns    []keyRuns
	KeyRunsErr string
}

// keyRuns is one concurrency key's runs holding a slot.
type keyRuns struct {
	Key  string
	Runs int
}

// keyRunsShown is the most keys a queue's row lists: the busiest.
const keyRunsShown = 20

// queueStats reads every registered queue's counts, with or without rows:
// those of the outbox and of Redis's registry (where a worker registers the
// queues it serves), and those with controls (paused or limited before their
// first task); and Postgres's pause flag and cap of runs per key of each.
func (h *Handler) queueStats(ctx context.Context) (st []reconcile.QueueStats, paused map[string]bool, keyCap map[string]int, err error) {
	ctls, err := h.queues.List(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	opts := h.opts
	paused, keyCap = map[string]bool{}, map[string]int{}
	for _, c := range ctls {
		paused[c.Queue] = c.Paused
		keyCap[c.Queue] = c.KeyConcurrency
		opts.AlsoQueues = append(opts.AlsoQueues, c.Queue)
	}
	if st, err = reconcile.Stats(ctx, h.cfg.DB, h.cfg.Redis, opts); err != nil {
		return nil, nil, nil, err
	}
	return st, paused, keyCap, nil
}

func (h *Handler) queuesPage(w http.ResponseWriter, r *http.Request, p *page) {
	ctx, cancel := ctxOf(r)
	defer cancel()
	st, paused, keyCap, err := h.queueStats(ctx)
	if err != nil {
		h.fail(w, p, http.StatusBadGateway, err)
		return
	}
	names := make([]string, len(st))
	for i, s := range st {
		names[i] = s.Queue
	}
	// From Redis every queue's hour (one pipelined read) and pause flag.
	var (
		hist        map[string][]dispatch.Minute
		histErr     error
		redisPaused map[string]bool
		wg          sync.WaitGroup
	)
	wg.Go(func() { hist, histErr = h.cfg.Redis.History(ctx, p.Now, historyMinutes, names...) })
	wg.Go(func() { redisPaused, _ = h.cfg.Redis.PausedMany(ctx, names...) }) // a missing flag shows as Postgres's
	rows := make([]queueRow, len(st))
	for i, s := range st {
		if c := keyCap[s.Queue]; c > 0 { // a capped queue: its runs per key
			rows[i].KeyCap = c
			wg.Go(func() { rows[i].KeyRuns, rows[i].KeyRunsErr = h.keyRuns(ctx, s.Queue) })
		}
	}
	wg.Wait()
	for i, s := range st {
		rows[i].QueueStats, rows[i].RedisLive, rows[i].Paused, rows[i].RedisPaused = s, s.Ready+s.Active, paused[s.Queue], redisPaused[s.Queue]
		for _, n := range s.Postgres {
			rows[i].Total += n
		}
		rows[i].Agree, rows[i].Note = agreeCounts(s)
		if histErr != nil {
			rows[i].HistoryErr = histErr.Error()
		} else {
			rows[i].Hour = newHourView(hist[s.Queue])
		}
	}
	p.Title = "Queues"
	h.setRefresh(r, p)
	h.render(w, p, "queues", rows)
}

// setRefresh sets how often a page of counts reloads: Config.Refresh, or
// ?refresh=N (seconds, up to an hour).
func (h *Handler) setRefresh(r *http.Request, p *page) {
	p.Refresh = int(h.cfg.Refresh / time.Second)
	if v, err := strconv.Atoi(r.URL.Query().Get("refresh")); err == nil && v >= 0 && v <= 3600 {
		p.Refresh = v
	}
}

// keyRuns reads queue's runs holding a slot per concurrency key, busiest
// first, at most keyRunsShown; the error as text for the page.
func (h *Handler) keyRuns(ctx context.Context, queue string) ([]keyRuns, string) {
	m, err := h.cfg.Redis.KeyRuns(ctx, queue)
	if err != nil {
		return nil, err.Error()
	}
	out := make([]keyRuns, 0, len(m))
	for k, n := range m {
		out = append(out, keyRuns{k, n})
	}
	slices.SortFunc(out, func(a, b keyRuns) int { return cmp.Or(cmp.Compare(b.Runs, a.Runs), strings.Compare(a.Key, b.Key)) })
	return out[:min(len(out), keyRunsShown)], ""
}

// agreeCounts compares the counts of the two stores: every queued row is ready or
// active in Redis, every dead row dead. The counts are read one after the other,
// so a busy queue may differ for a moment; the consistency check is the word.
func agreeCounts(s reconcile.QueueStats) (bool, string) {
	queued, dead := s.Postgres[delayqtype.StateQueued], s.Postgres[delayqtype.StateDead]
	var notes []string
	if live := s.Ready + s.Active; live != queued {
		notes = append(notes, fmt.Sprintf("queued %d in Postgres, %d ready or active in Redis", queued, live))
	}
	if s.Dead != dead {
		notes = append(notes, fmt.Sprintf("dead %d in Postgres, %d in Redis", dead, s.Dead))
	}
	return len(notes) == 0, strings.Join(notes, "; ")
}

// --- tasks ---

type listRow struct {
	taskstate.BrowseRow
	Redis  dispatch.TaskInfo
	Agree  bool
	Note   string
	Dueish bool
}

type tasksData struct {
	Filter             taskstate.Filter
	Queue, State       string
	Prefix, From, To   string
	States             []taskstate.State
	Rows               []listRow
	Next               template.URL // the next page, "" for none
	First              template.URL // the first page
	Kind               listKind
	RedisUnavailable   string
	PurgeAllQueue      string
	ConfirmPurgeAllFor string
	// Sort is the order asked for ("" the state's own); Sorts the choices.
	Sort  string
	Sorts []taskstate.Sort
	// Bounded: the sort reads the queue's rows, under the time limit.
	Bounded bool
	// Path and Value are a search by payload; Search what its page read.
	Path, Value string
	Search      *searchNote
	// ScanRows and TimeLimit are the limits of a search and of a sort without
	// an index, as the page says them.
	ScanRows, TimeLimit string
	// Bulk are the bulk actions the list offers (none: no form, no ticks).
	Bulk    []bulkAction
	BulkMax string
}

// searchNote tells what a page of a search by payload read.
type searchNote struct {
	Scanned, Found int
	After          string // where this page started ("" the queue's first row)
	Complete       bool   // the queue's last row was read
}

func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("time %q: want RFC 3339 or YYYY-MM-DD[ HH:MM[:SS]] (UTC)", s)
}

// listKind is a list page: every task, or the dead letters. It is the page's path.
type listKind string

const (
	taskList listKind = "tasks"
	deadList listKind = "dead" // the dead letters: the tasks in state dead
)

func (h *Handler) list(w http.ResponseWriter, r *http.Request, p *page, kind listKind) {
	q := r.URL.Query()
	d := tasksData{Kind: kind, States: taskstate.States, Sorts: taskstate.Sorts, ScanRows: thousands(searchScanRows), TimeLimit: thousands(int(queryTimeLimit.Milliseconds())) + " ms",
		Queue: q.Get("queue"), State: q.Get("state"), Prefix: q.Get("prefix"), From: q.Get("from"), To: q.Get("to"),
		Sort: q.Get("sort"), Path: q.Get("path"), Value: q.Get("value")}
	if kind == deadList {
		d.State = string(taskstate.Dead)
	}
	if p.CanAct {
		d.Bulk, d.BulkMax = bulkOffered(d.State), thousands(bulkMax)
	}
	// An exact id goes to its page.
	if id := q.Get("id"); id != "" && d.Queue != "" {
		http.Redirect(w, r, h.cfg.BasePath+"/task?queue="+url.QueryEscape(d.Queue)+"&id="+url.QueryEscape(id), http.StatusSeeOther)
		return
	}
	f := taskstate.Filter{Queue: d.Queue, State: taskstate.State(d.State), Prefix: d.Prefix, Sort: taskstate.Sort(d.Sort)}
	var err error
	if f.DueFrom, err = parseTime(d.From); err == nil {
		f.DueBefore, err = parseTime(d.To)
	}
	var cur taskstate.Cursor
	if err == nil && q.Get("at") != "" {
		cur.At, err = time.Parse(time.RFC3339Nano, q.Get("at"))
	}
	cur.Queue, cur.ID = q.Get("cq"), q.Get("cid")
	byID := f.Sort == taskstate.SortID || f.Sort == "" && (f.Prefix != "" || f.State == "" || f.State == taskstate.Queued)
	if err == nil && f.Queue == "" && byID {
		err = errors.New("choose a queue to list its tasks by id (or a state: pending, done, dead or cancelled)")
	}
	if kind == deadList {
		p.Title = "Dead letters"
	} else {
		p.Title = "Tasks"
	}
	d.Filter = f
	if err != nil {
		p.Error = err.Error()
		h.render(w, p, "tasks", d)
		return
	}
	ctx, cancel := ctxOf(r)
	defer cancel()
	if d.Path != "" || d.Value != "" {
		h.search(ctx, w, r, p, d, f)
		return
	}
	var rows []taskstate.BrowseRow
	var next taskstate.Cursor
	if d.Bounded = f.Sort.Scans(f); d.Bounded {
		err = h.bounded(ctx, func(tx pgx.Tx) (err error) {
			rows, next, err = h.browse.List(ctx, tx, f, cur, h.cfg.PageSize)
			return err
		})
	} else {
		rows, next, err = h.browse.List(ctx, h.cfg.DB, f, cur, h.cfg.PageSize)
	}
	if err != nil {
		if errors.Is(err, errTooLong) || errors.Is(err, taskstate.ErrBrowse) && !strings.Contains(err.Error(), "list:") {
			p.Error = err.Error()
			h.render(w, p, "tasks", d)
			return
		}
		h.fail(w, p, http.StatusBadGateway, err)
		return
	}
	h.showRows(ctx, r, p, &d, rows)
	if next != (taskstate.Cursor{}) {
		nv := listValues(r)
		if !next.At.IsZero() {
			nv.Set("at", next.At.Format(time.RFC3339Nano))
		}
		nv.Set("cq", next.Queue)
		nv.Set("cid", next.ID)
		d.Next = template.URL(h.cfg.BasePath + "/" + string(kind) + "?" + nv.Encode())
	}
	h.render(w, p, "tasks", d)
}

// thousands writes n with a comma every three digits: 100,000.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// listValues are the list's filters, for the links to its pages.
func listValues(r *http.Request) url.Values {
	q, base := r.URL.Query(), url.Values{}
	for _, k := range []string{"queue", "state", "prefix", "from", "to", "sort", "path", "value"} {
		if v := q.Get(k); v != "" {
			base.Set(k, v)
		}
	}
	return base
}

// showRows fills the page's rows, with what Redis holds of each, and its links.
func (h *Handler) showRows(ctx context.Context, r *http.Request, p *page, d *tasksData, rows []taskstate.BrowseRow) {
	d.Rows = make([]listRow, len(rows))
	for i, row := range rows {
		d.Rows[i].BrowseRow = row
		d.Rows[i].Dueish = row.State.Live() && !row.RunAt.After(p.Now)
	}
	if err := h.inspect(ctx, d.Rows); err != nil {
		d.RedisUnavailable = err.Error()
	}
	// Built from url.Values, so the URLs are safe as they are.
	d.First = template.URL(h.cfg.BasePath + "/" + string(d.Kind) + "?" + listValues(r).Encode())
	if d.Kind == deadList && d.Queue != "" {
		d.PurgeAllQueue = d.Queue
	}
}

// search shows a page of a search by payload: the next rows of the queue in id
// order, at most searchScanRows of them and for at most queryTimeLimit, whose
// payload is JSON with the value asked for at the path; the next page goes on
// from where this one stopped.
func (h *Handler) search(ctx context.Context, w http.ResponseWriter, r *http.Request, p *page, d tasksData, f taskstate.Filter) {
	jq, err := parseJSONQuery(d.Path, d.Value)
	switch {
	case h.cfg.HidePayloads:
		err = errors.New("payloads are hidden on this dashboard: no search by payload")
	case err != nil:
	case d.Queue == "":
		err = errors.New("choose a queue to search its payloads")
	case f.Prefix != "" || f.Sort != "" && f.Sort != taskstate.SortID || !f.DueFrom.IsZero() || !f.DueBefore.IsZero():
		err = errors.New("a search by payload reads the queue in id order: clear the id prefix, the due window and the sort")
	}
	if err != nil {
		p.Error = err.Error()
		h.render(w, p, "tasks", d)
		return
	}
	after := r.URL.Query().Get("after")
	var step taskstate.SearchStep
	err = h.bounded(ctx, func(tx pgx.Tx) (err error) {
		step, err = h.browse.Search(ctx, tx, d.Queue, f.State, jq.needle, after, searchScanRows, max(4*h.cfg.PageSize, 50))
		return err
	})
	if err != nil {
		if errors.Is(err, errTooLong) {
			p.Error = "The search " + err.Error()
			h.render(w, p, "tasks", d)
			return
		}
		h.fail(w, p, http.StatusBadGateway, err)
		return
	}
	var rows []taskstate.BrowseRow
	for _, row := range step.Rows {
		if jq.matches(row.Payload) {
			rows = append(rows, row.BrowseRow)
		}
	}
	d.Search = &searchNote{Scanned: step.Scanned, Found: len(rows), After: after, Complete: step.Complete}
	h.showRows(ctx, r, p, &d, rows)
	if !step.Complete {
		nv := listValues(r)
		nv.Set("after", step.Last)
		d.Next = template.URL(h.cfg.BasePath + "/" + string(d.Kind) + "?" + nv.Encode())
	}
	h.render(w, p, "tasks", d)
}

// inspect reads what Redis holds of each row, one atomic read per queue.
func (h *Handler) inspect(ctx context.Context, rows []listRow) error {
	byQueue := map[string][]int{}
	for i, r := range rows {
		byQueue[r.Queue] = append(byQueue[r.Queue], i)
	}
	for q, idx := range byQueue {
		ids := make([]string, len(idx))
		for j, i := range idx {
			ids[j] = rows[i].ID
		}
		infos, err := h.cfg.Redis.Inspect(ctx, q, ids...)
		if err != nil {
			return err
		}
		for j, i := range idx {
			rows[i].Redis = infos[j]
			rows[i].Agree, rows[i].Note = agree(rows[i].BrowseRow, infos[j])
		}
	}
	return nil
}

// agree tells whether Redis's view of a task is one the design allows for its
// row, and if not, what differs.
func agree(row taskstate.BrowseRow, rd dispatch.TaskInfo) (bool, string) {
	in := rd.State == dispatch.StateReady || rd.State == dispatch.StateActive
	switch row.State {
	case taskstate.Pending:
		switch {
		case rd.State == dispatch.StateMissing:
			return true, "waiting for the relay"
		case in && rd.Version < row.Version:
			return true, fmt.Sprintf("older version %d in Redis: the relay replaces it", rd.Version)
		case in:
			return true, "the relay is moving it"
		case rd.State == dispatch.StateDead || rd.State == dispatch.StateDone:
			return true, "a finished record of an earlier life: the relay replaces it"
		}
	case taskstate.Queued:
		switch {
		case in && rd.Version == row.Version:
			return true, ""
		case rd.State == dispatch.StateMissing:
			return false, "missing in Redis: reconcile restores it"
		case in:
			return false, fmt.Sprintf("Redis holds version %d", rd.Version)
		case rd.State == dispatch.StateDead:
			return false, "dead in Redis: the worker's death is being recorded, or reconcile mirrors it"
		}
		return false, "done in Redis, queued in Postgres"
	case taskstate.Waiting:
		if rd.State == dispatch.StateMissing {
			return true, "waiting on its dependencies: the relay moves it once they finish"
		}
		return false, "waiting in Postgres, " + string(rd.State) + " in Redis: reconcile removes it"
	case taskstate.Dead:
		switch rd.State {
		case dispatch.StateDead, dispatch.StateMissing:
			return true, ""
		}
		return false, "dead in Postgres, " + string(rd.State) + " in Redis: reconcile repairs it"
	default: // done, cancelled
		if in {
			return true, string(row.State) + " in Postgres: the guard suppresses the copy in Redis"
		}
		return true, ""
	}
	return false, "unexpected"
}

func (h *Handler) tasksPage(w http.ResponseWriter, r *http.Request, p *page) {
	h.list(w, r, p, taskList)
}
func (h *Handler) deadPage(w http.ResponseWriter, r *http.Request, p *page) {
	h.list(w, r, p, deadList)
}

// --- task ---

type taskData struct {
	Queue, ID   string
	Found       bool
	Row         taskstate.TaskRow
	Redis       dispatch.TaskInfo
	RedisErr    string
	Agree       bool
	Note        string
	Payload     string // pretty-printed, or text, or hex; "" when hidden
	PayloadKind string // json, text, binary
	Truncated   bool
	RedisPaySz  int
	// Editable: a dead task whose whole payload is shown as JSON or text can be
	// retried with an edited payload.
	Editable bool
	// EditText is the edit box's text: the payload, or an edit refused
	// (EditError says why), kept for the operator to correct.
	EditText, EditError string
	// Released: a done or cancelled task that Redis no longer holds, as it should.
	Released bool
	// Workflow: its dependencies, dependents, result and workflow (workflow.go).
	Workflow workflowData
}

// EditRows is the edit box's height.
func (d taskData) EditRows() int { return editRows(d.EditText) }

func (h *Handler) taskPage(w http.ResponseWriter, r *http.Request, p *page) {
	q := r.URL.Query()
	ctx, cancel := ctxOf(r)
	defer cancel()
	d, err := h.loadTask(ctx, q.Get("queue"), q.Get("id"))
	p.Title = "Task " + d.ID
	if err != nil {
		h.fail(w, p, http.StatusBadGateway, err)
		return
	}
	if !d.Found && (d.Redis.State == "" || d.Redis.State == dispatch.StateMissing) {
		w.WriteHeader(http.StatusNotFound)
	}
	h.render(w, p, "task", d)
}

// loadTask reads a task's page: its row in Postgres and what Redis holds of it.
func (h *Handler) loadTask(ctx context.Context, queue, id string) (taskData, error) {
	d := taskData{Queue: queue, ID: id}
	capBytes := h.cfg.PayloadCap
	if h.cfg.HidePayloads {
		capBytes = 0
	}
	row, ok, err := h.browse.Task(ctx, h.cfg.DB, d.Queue, d.ID, capBytes)
	if err != nil {
		return d, err
	}
	d.Found, d.Row = ok, row
	if ok {
		d.Workflow = h.loadWorkflow(ctx, row)
	}
	infos, err := h.cfg.Redis.Inspect(ctx, d.Queue, d.ID)
	switch {
	case err != nil:
		d.RedisErr = err.Error()
	case len(infos) == 1:
		d.Redis = infos[0]
		d.RedisPaySz = len(d.Redis.Payload)
		d.Redis.Payload = nil // shown from Postgres, the truth
	}
	if ok && d.RedisErr == "" {
		d.Agree, d.Note = agree(row.BrowseRow, d.Redis)
		// A finished task leaves Redis: its absence there is the outcome, not a fault.
		d.Released = (row.State == taskstate.Done || row.State == taskstate.Cancelled) && d.Redis.State == dispatch.StateMissing
	} else if !ok && d.Redis.State != "" && d.Redis.State != dispatch.StateMissing {
		d.Note = "in Redis only: no outbox row (enqueued into Redis directly, or purged)"
	}
	if ok && !h.cfg.HidePayloads {
		d.Truncated = row.PayloadBytes > len(row.Payload)
		d.Payload, d.PayloadKind = showPayload(row.Payload, d.Truncated)
		d.Editable = row.State == taskstate.Dead && !d.Truncated && d.PayloadKind != "binary"
		d.EditText = d.Payload
	}
	return d, nil
}

// editRows sizes the edit box to its text: 4 to 30 rows.
func editRows(s string) int { return min(max(strings.Count(s, "\n")+2, 4), 30) }

// showPayload renders a payload for reading: indented JSON when it is whole and
// valid JSON, text when it is UTF-8, else a hex dump. (The template escapes it.)
func showPayload(b []byte, truncated bool) (string, string) {
	if !truncated && json.Valid(b) {
		var out bytes.Buffer
		if json.Indent(&out, b, "", "  ") == nil {
			return out.String(), "json"
		}
	}
	if utf8.Valid(b) || truncated && utf8.Valid(b[:max(0, len(b)-3)]) {
		return strings.ToValidUTF8(string(b), "\uFFFD"), "text"
	}
	var out strings.Builder
	for i := 0; i < len(b); i += 16 {
		end := min(i+16, len(b))
		fmt.Fprintf(&out, "%08x  % x\n", i, b[i:end])
	}
	return out.String(), "binary"
}

// --- consistency ---

type checkResult struct {
	At     time.Time
	Report reconcile.Report
	Err    string
	Kinds  []kindCount
}

type kindCount struct {
	Kind     reconcile.Kind
	Describe string
	Found    int
	Samples  []string
}

func (h *Handler) consistencyPage(w http.ResponseWriter, r *http.Request, p *page) {
	h.mu.Lock()
	last := h.lastCheck
	h.mu.Unlock()
	p.Title = "Consistency"
	h.render(w, p, "consistency", last)
}

// sortedKinds lists the report's buckets in the order of reconcile.AllKinds.
func sortedKinds(rep reconcile.Report) []kindCount {
	var out []kindCount
	for _, k := range reconcile.AllKinds() {
		b := rep.Kinds[k]
		if b == nil {
			continue
		}
		out = append(out, kindCount{Kind: k, Describe: k.Describe(), Found: b.Found, Samples: b.Samples})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Found > out[j].Found })
	return out
}
