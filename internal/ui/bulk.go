package ui

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/transition"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// Bulk actions on a task list: the tasks ticked on its page, or every task
// matching its filter. The list's form posts to /action/bulk, which changes
// nothing and shows a preview (how many tasks, by queue and by state, which are
// skipped and why); its confirmation posts to /action/bulk-run, which reads the
// set again, acts on at most the previewed count plus a margin, in batches,
// through the operations a single task's action runs, and shows what it did.
const (
	// bulkMaxTicked is the most tasks ticked on a page one action takes: a page
	// holds at most 500 rows (Config.PageSize).
	bulkMaxTicked = 500
	// bulkMax is the most tasks one action by filter takes: the preview and the
	// action read at most bulkMax+1 rows of the filter (the list's own keyset
	// statements, each under queryTimeLimit), and act on the first bulkMax in the
	// list's order; the page says so, and the operator runs it again for the rest.
	bulkMax = 10_000
	// bulkSearchRows is the most rows of the queue a bulk action over a search
	// by payload reads (steps of searchScanRows).
	bulkSearchRows = 5 * searchScanRows
	// bulkReadTime is the longest a bulk action's read of its set runs, and
	// bulkStatementTime each of its statements (a page's is queryTimeLimit: a
	// preview reads up to 200 times a page's rows). At 1,000,000 rows on a
	// loaded machine the slowest preview took 0.42 s (BENCHMARKS.md).
	bulkReadTime      = 5 * time.Second
	bulkStatementTime = time.Second
	// bulkBatch is the tasks of one transaction (one statement for retry and
	// purge).
	bulkBatch = 500
	// bulkTime is the longest an action runs (within delayq ui's write timeout
	// of a minute); batches committed before stand. 10,000 cancels take about
	// 7 s (TestBulkBatchesAndLimit).
	bulkTime = 45 * time.Second
)

// bulkMargin is how many more tasks than the preview showed an action by filter
// may act on: 10%, at least 10 (tasks that joined the filter between the
// preview and the confirmation, as a producer still enqueueing adds them).
func bulkMargin(n int) int { return max(10, n/10) }

// bulkAction is what a bulk action does to each task.
type bulkAction string

const (
	bulkCancel     bulkAction = "cancel"
	bulkRunNow     bulkAction = "run-now"
	bulkReschedule bulkAction = "reschedule"
	bulkRetry      bulkAction = "retry"
	bulkPurge      bulkAction = "purge"
)

var bulkActions = []bulkAction{bulkCancel, bulkRunNow, bulkReschedule, bulkRetry, bulkPurge}

// Allows reports whether a task in state s can take the action.
func (a bulkAction) Allows(s taskstate.State) bool {
	switch a {
	case bulkCancel, bulkRunNow, bulkReschedule:
		return s.Live()
	case bulkRetry, bulkPurge:
		return s == taskstate.Dead
	}
	return false
}

// Label is the action as the page names it.
func (a bulkAction) Label() string {
	if a == bulkRunNow {
		return "run now"
	}
	return string(a)
}

// why says why a task in state s is skipped.
func (a bulkAction) why(s taskstate.State) string {
	switch a {
	case bulkRetry:
		return fmt.Sprintf("%s: only a dead task can be retried", s)
	case bulkPurge:
		return fmt.Sprintf("%s: only a dead task can be purged (done and cancelled rows go by the relay's retention)", s)
	}
	return fmt.Sprintf("%s: only a pending or queued task can %s", s, map[bulkAction]string{
		bulkCancel: "be cancelled", bulkRunNow: "run now", bulkReschedule: "be rescheduled"}[a])
}

// bulkOffered are the actions a list of state (”: any) offers.
func bulkOffered(state string) []bulkAction {
	if state == "" {
		return bulkActions
	}
	var out []bulkAction
	for _, a := range bulkActions {
		if a.Allows(taskstate.State(state)) {
			out = append(out, a)
		}
	}
	return out
}

// bulkRequest is a bulk action's form: what to do, to which tasks. Every field
// comes from the request and is checked by parseBulk; the page shows it again
// (escaped) so that a refused form keeps what was typed.
type bulkRequest struct {
	Kind   listKind
	Action bulkAction
	When   string
	Scope  string   // "ticked" or "filter"
	Ticked []string // "queue id", as the list's checkboxes post them
	// The list's filter.
	Queue, State, Prefix, From, To, Sort, Path, Value string
	// Expect is the count the preview showed (the confirmation's).
	Expect int

	keys   []taskKey
	filter taskstate.Filter
	search *jsonQuery
	at     time.Time // reschedule and run now: the new due time
}

// At is the new due time of a reschedule, as of the request.
func (req bulkRequest) At() time.Time { return req.at }

type taskKey struct{ Queue, ID string }

// errBulk reports a bulk form the dashboard refuses.
var errBulk = errors.New("bulk action refused")

func bulkErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBulk, fmt.Sprintf(format, args...))
}

// parseBulk reads and checks a bulk action's form; nothing is read from the
// database yet.
func (h *Handler) parseBulk(r *http.Request, now time.Time) (bulkRequest, error) {
	f := r.PostForm
	req := bulkRequest{Kind: listKind(f.Get("kind")), Action: bulkAction(f.Get("action")), When: f.Get("when"), Scope: f.Get("scope"),
		Queue: f.Get("queue"), State: f.Get("state"), Prefix: f.Get("prefix"), From: f.Get("from"), To: f.Get("to"),
		Sort: f.Get("sort"), Path: f.Get("path"), Value: f.Get("value")}
	if req.Kind != deadList {
		req.Kind = taskList
	}
	if req.Kind == deadList {
		req.State = string(taskstate.Dead)
	}
	if len(f["sel"]) <= bulkMaxTicked {
		req.Ticked = f["sel"]
	}
	if !slices.Contains(bulkActions, req.Action) {
		return req, bulkErr("choose an action: cancel, run now, reschedule, retry or purge")
	}
	switch req.Action {
	case bulkReschedule:
		at, err := parseWhen(req.When, now)
		if err != nil {
			return req, bulkErr("reschedule to when? %v", err)
		}
		if at.Year() > 9999 {
			return req, bulkErr("reschedule to %s: after the year 9999", at.UTC().Format(time.RFC3339))
		}
		req.at = at
	case bulkRunNow:
		req.at = now
	}
	if v := f.Get("expect"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > bulkMax {
			return req, bulkErr("expect %q: a count of 0..%d", v, bulkMax)
		}
		req.Expect = n
	}
	switch req.Scope {
	case "ticked":
		return req, req.parseTicked(f["sel"])
	case "filter":
		return req, h.parseFilter(&req)
	}
	return req, bulkErr("choose the tasks: those ticked, or every task matching the filter")
}

func (req *bulkRequest) parseTicked(sel []string) error {
	switch {
	case len(sel) == 0:
		return bulkErr("no task ticked: tick tasks on the list, or choose every task matching the filter")
	case len(sel) > bulkMaxTicked:
		return bulkErr("%d tasks ticked: at most %d (a page); choose every task matching the filter", len(sel), bulkMaxTicked)
	}
	seen := map[taskKey]bool{}
	for _, s := range sel {
		q, id, ok := strings.Cut(s, " ")
		if !ok {
			return bulkErr("ticked task %q: not a queue and an id", s)
		}
		if err := errors.Join(validate.Queue(q), validate.TaskID(id)); err != nil {
			return bulkErr("ticked task: %v", err)
		}
		if k := (taskKey{q, id}); !seen[k] {
			seen[k] = true
			req.keys = append(req.keys, k)
		}
	}
	return nil
}

// parseFilter checks the list's filter as the list page does.
func (h *Handler) parseFilter(req *bulkRequest) error {
	f := taskstate.Filter{Queue: req.Queue, State: taskstate.State(req.State), Prefix: req.Prefix, Sort: taskstate.Sort(req.Sort)}
	if f.Queue != "" {
		if err := validate.Queue(f.Queue); err != nil {
			return bulkErr("%v", err)
		}
	}
	if f.State != "" {
		if _, err := taskstate.Parse(req.State); err != nil {
			return bulkErr("state %q: pending, queued, done, dead or cancelled", req.State)
		}
	}
	if !slices.Contains(append([]taskstate.Sort{""}, taskstate.Sorts...), f.Sort) {
		return bulkErr("sort %q: id, due, created or finished", req.Sort)
	}
	var err error
	if f.DueFrom, err = parseTime(req.From); err == nil {
		f.DueBefore, err = parseTime(req.To)
	}
	if err != nil {
		return bulkErr("%v", err)
	}
	// A sort with no index reads the whole queue each step: the set is the same
	// in the state's own order.
	if f.Sort.Scans(f) {
		f.Sort = ""
	}
	if req.Path != "" || req.Value != "" {
		jq, err := parseJSONQuery(req.Path, req.Value)
		switch {
		case h.cfg.HidePayloads:
			err = errors.New("payloads are hidden on this dashboard: no search by payload")
		case err != nil:
		case f.Queue == "":
			err = errors.New("choose a queue to search its payloads")
		case f.Prefix != "" || !f.DueFrom.IsZero() || !f.DueBefore.IsZero():
			err = errors.New("a search by payload reads the queue in id order: clear the id prefix and the due window")
		}
		if err != nil {
			return bulkErr("%v", err)
		}
		req.search = &jq
	} else if f.Queue == "" && (f.Sort == taskstate.SortID || f.Sort == "" && (f.Prefix != "" || f.State == "" || f.State == taskstate.Queued)) {
		return bulkErr("choose a queue (or a state: pending, done, dead or cancelled)")
	}
	req.filter = f
	return nil
}

// values are the list's filter, for its URL and the forms.
func (req bulkRequest) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"queue": req.Queue, "state": req.State, "prefix": req.Prefix, "from": req.From,
		"to": req.To, "sort": req.Sort, "path": req.Path, "value": req.Value} {
		if s != "" && !(req.Kind == deadList && k == "state") {
			v.Set(k, s)
		}
	}
	return v
}

// bulkSet is the tasks a bulk action reads: the ticked ones, or those matching
// the filter (at most bulkMax, in the list's order).
type bulkSet struct {
	Rows []taskstate.BrowseRow
	// Gone are ticked tasks with no row.
	Gone int
	// More: more than bulkMax tasks match; Rows are the first.
	More bool
	// Scanned: the rows a search read; Upto the last id it read ("" the
	// queue's last row).
	Scanned int
	Upto    string
}

// read reads the set of req: its rows now.
func (h *Handler) read(ctx context.Context, req bulkRequest) (bulkSet, error) {
	var set bulkSet
	if req.Scope == "ticked" {
		queues, ids := make([]string, len(req.keys)), make([]string, len(req.keys))
		for i, k := range req.keys {
			queues[i], ids[i] = k.Queue, k.ID
		}
		rows, err := h.browse.Rows(ctx, h.cfg.DB, queues, ids)
		set.Rows, set.Gone = rows, len(req.keys)-len(rows)
		return set, err
	}
	rctx, cancel := context.WithTimeout(ctx, bulkReadTime)
	defer cancel()
	err := h.boundedBy(rctx, bulkStatementTime, func(tx pgx.Tx) error {
		ctx := rctx
		if req.search != nil {
			return h.readSearch(ctx, tx, req, &set)
		}
		var cur taskstate.Cursor
		for {
			rows, next, err := h.browse.List(ctx, tx, req.filter, cur, 1000)
			if err != nil {
				return err
			}
			set.Rows = append(set.Rows, rows...)
			if len(set.Rows) > bulkMax {
				set.Rows, set.More = set.Rows[:bulkMax], true
				return nil
			}
			if next == (taskstate.Cursor{}) {
				return nil
			}
			cur = next
		}
	})
	if errors.Is(err, errTooLong) || err != nil && rctx.Err() != nil && ctx.Err() == nil {
		err = errBulkTooLong
	}
	return set, err
}

var errBulkTooLong = fmt.Errorf("%w: reading the tasks stopped at the time limit (%v a statement, %v in all), so as not to load the database: narrow the filter (a state, a due window, an id prefix)",
	errBulk, bulkStatementTime, bulkReadTime)

// readSearch reads the rows a search by payload finds, from the queue's first
// row, at most bulkSearchRows rows read: the preview's and the confirmation's
// windows are the same rows but those enqueued or purged in between, and the
// confirmation's cap bounds the difference. (No id bound is carried from the
// preview: ids compare by the database's collation, not Go's.)
func (h *Handler) readSearch(ctx context.Context, tx pgx.Tx, req bulkRequest, set *bulkSet) error {
	after := ""
	for set.Scanned < bulkSearchRows {
		// At most bulkBatch payloads a step (a step stops at its last hit): the
		// memory a step holds is bounded as a page's is.
		step, err := h.browse.Search(ctx, tx, req.Queue, req.filter.State, req.search.needle, after, searchScanRows, bulkBatch)
		if err != nil {
			return err
		}
		set.Scanned += step.Scanned
		for _, row := range step.Rows {
			if req.search.matches(row.Payload) {
				set.Rows = append(set.Rows, row.BrowseRow)
				if len(set.Rows) > bulkMax {
					set.Rows, set.More = set.Rows[:bulkMax], true
					set.Upto = set.Rows[bulkMax-1].ID
					return nil
				}
			}
		}
		if step.Complete {
			return nil
		}
		after, set.Upto = step.Last, step.Last
	}
	return nil
}

// bulkCount is a count of a preview's table.
type bulkCount struct {
	Name      string
	Act, Skip int
}

// bulkPreview is what an action would do, as read now.
type bulkPreview struct {
	bulkSet
	Act, Skip        int
	ByQueue, ByState []bulkCount
	Skips            []bulkCount // Name: why
	Margin           int
	// Others are the actions the tasks' states allow, for a change of mind.
	Others []bulkAction
}

func newPreview(req bulkRequest, set bulkSet) *bulkPreview {
	p := &bulkPreview{bulkSet: set}
	byQueue, byState, skips := map[string]*bulkCount{}, map[string]*bulkCount{}, map[string]*bulkCount{}
	add := func(m map[string]*bulkCount, k string, act bool) {
		c := m[k]
		if c == nil {
			c = &bulkCount{Name: k}
			m[k] = c
		}
		if act {
			c.Act++
		} else {
			c.Skip++
		}
	}
	states := map[taskstate.State]bool{}
	for _, row := range set.Rows {
		ok := req.Action.Allows(row.State)
		states[row.State] = true
		add(byQueue, row.Queue, ok)
		add(byState, string(row.State), ok)
		if ok {
			p.Act++
		} else {
			p.Skip++
			add(skips, req.Action.why(row.State), false)
		}
	}
	if set.Gone > 0 {
		p.Skip += set.Gone
		skips["gone: no such task (purged, or never enqueued)"] = &bulkCount{Name: "gone: no such task (purged, or never enqueued)", Skip: set.Gone}
	}
	for _, a := range bulkActions {
		for s := range states {
			if a != req.Action && a.Allows(s) {
				p.Others = append(p.Others, a)
				break
			}
		}
	}
	p.ByQueue, p.ByState, p.Skips = sortedCounts(byQueue), sortedCounts(byState), sortedCounts(skips)
	p.Margin = bulkMargin(p.Act)
	return p
}

func sortedCounts(m map[string]*bulkCount) []bulkCount {
	out := make([]bulkCount, 0, len(m))
	for _, c := range m {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b bulkCount) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// bulkResult is what an action did.
type bulkResult struct {
	Done, Skipped, Failed int
	ByQueue               []bulkCount // Act: done
	Skips                 []bulkCount // Name: why
	// Left are tasks that matched beyond the previewed count and its margin:
	// not touched.
	Left int
	More bool // more than bulkMax matched: run it again for the rest
	// Errors are the failures (a batch that failed is rolled back: Failed
	// counts its tasks; the batches after it are not run and count too).
	Errors []string
	// RedisNote: a purge deleted rows but did not clean Redis; reconcile does.
	RedisNote string
}

type bulkData struct {
	Req     bulkRequest
	Offered []bulkAction
	Preview *bulkPreview
	Result  *bulkResult
	List    template.URL
}

func (h *Handler) bulkPage(w http.ResponseWriter, p *page, code int, d bulkData) {
	d.List = template.URL(h.cfg.BasePath + "/" + string(d.Req.Kind) + "?" + d.Req.values().Encode())
	if d.Offered == nil {
		d.Offered = bulkOffered(d.Req.State)
	}
	if code != http.StatusOK {
		w.WriteHeader(code)
	}
	h.render(w, p, "bulk", d)
}

// actBulk previews a bulk action: it reads the set and changes nothing.
func (h *Handler) actBulk(w http.ResponseWriter, r *http.Request, p *page) {
	p.Title = "Bulk action: preview"
	req, err := h.parseBulk(r, time.Now())
	if err != nil {
		p.Error = err.Error()
		h.bulkPage(w, p, http.StatusBadRequest, bulkData{Req: req})
		return
	}
	ctx, cancel := ctxOf(r)
	defer cancel()
	set, err := h.read(ctx, req)
	if err != nil {
		h.bulkReadFailed(w, p, req, err)
		return
	}
	h.bulkPage(w, p, http.StatusOK, bulkData{Req: req, Preview: newPreview(req, set)})
}

func (h *Handler) bulkReadFailed(w http.ResponseWriter, p *page, req bulkRequest, err error) {
	if errors.Is(err, errBulkTooLong) || errors.Is(err, taskstate.ErrBrowse) && !strings.Contains(err.Error(), "list:") &&
		!strings.Contains(err.Error(), "rows:") && !strings.Contains(err.Error(), "search:") {
		p.Error = err.Error()
		h.bulkPage(w, p, http.StatusUnprocessableEntity, bulkData{Req: req})
		return
	}
	h.fail(w, p, http.StatusBadGateway, err)
}

// actBulkRun runs a confirmed bulk action.
func (h *Handler) actBulkRun(w http.ResponseWriter, r *http.Request, p *page) {
	p.Title = "Bulk action: result"
	now := time.Now()
	req, err := h.parseBulk(r, now)
	if err == nil && !r.PostForm.Has("expect") {
		err = bulkErr("no previewed count: preview the action first")
	}
	if err != nil {
		p.Error = err.Error()
		h.bulkPage(w, p, http.StatusBadRequest, bulkData{Req: req})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), bulkTime)
	defer cancel()
	set, err := h.read(ctx, req)
	if err != nil {
		h.bulkReadFailed(w, p, req, err)
		return
	}
	h.bulkPage(w, p, http.StatusOK, bulkData{Req: req, Result: h.runBulk(ctx, req, set)})
}

// runBulk acts on the tasks of set the action allows, at most the previewed
// count plus its margin, in batches of one queue's tasks.
func (h *Handler) runBulk(ctx context.Context, req bulkRequest, set bulkSet) *bulkResult {
	res := &bulkResult{More: set.More}
	skips := map[string]*bulkCount{}
	skip := func(why string, n int) {
		if n == 0 {
			return
		}
		if skips[why] == nil {
			skips[why] = &bulkCount{Name: why}
		}
		skips[why].Skip += n
		res.Skipped += n
	}
	skip("gone: no such task (purged, or never enqueued)", set.Gone)
	limit := req.Expect
	if req.Scope == "filter" {
		limit = min(req.Expect+bulkMargin(req.Expect), bulkMax)
	}
	var act []taskstate.BrowseRow
	for _, row := range set.Rows {
		switch {
		case !req.Action.Allows(row.State):
			skip(req.Action.why(row.State), 1)
		case len(act) >= limit && req.Scope == "filter":
			res.Left++
		default:
			act = append(act, row)
		}
	}
	// One queue's tasks a batch, in the order read.
	slices.SortStableFunc(act, func(a, b taskstate.BrowseRow) int { return cmp.Compare(a.Queue, b.Queue) })
	done := map[string]*bulkCount{}
	for start := 0; start < len(act); {
		end := start + 1
		for end < len(act) && end-start < bulkBatch && act[end].Queue == act[start].Queue {
			end++
		}
		batch := act[start:end]
		n, skipped, err := h.bulkBatch(ctx, req, batch)
		if done[batch[0].Queue] == nil {
			done[batch[0].Queue] = &bulkCount{Name: batch[0].Queue}
		}
		done[batch[0].Queue].Act += n
		res.Done += n
		for why, k := range skipped {
			skip(why, k)
		}
		var se *transition.StepError
		if errors.As(err, &se) {
			res.RedisNote = "Rows deleted, but Redis was not cleaned: " + se.Err.Error() + " (check and reconcile repair it)."
		} else if err != nil {
			res.Errors = append(res.Errors, err.Error())
			res.Failed += len(act) - start - n
			break
		}
		start = end
	}
	res.ByQueue, res.Skips = sortedCounts(done), sortedCounts(skips)
	return res
}

// The reasons a task valid when read is skipped when acted on: it changed in
// between.
const (
	skipFinished = "finished meanwhile (by a worker, or another operator)"
	skipGone     = "gone meanwhile (purged)"
	skipNotDead  = "no longer dead (retried or purged meanwhile)"
	skipStartBy  = "its start deadline comes before the new time: it could never start"
)

// bulkBatch acts on tasks of one queue, through the operations of one task's
// action: outbox.Cancel and Reschedule (the task page's cancel, run now and
// reschedule) in one transaction, or transition's RetryDead and PurgeDead (what
// reconcile.RetryDead and PurgeDeadTask run) in one statement. It returns how
// many it changed and why the others were skipped; an error rolls the batch
// back (but a purge's Redis step: the rows are deleted).
func (h *Handler) bulkBatch(ctx context.Context, req bulkRequest, batch []taskstate.BrowseRow) (int, map[string]int, error) {
	queue := batch[0].Queue
	ids := make([]string, len(batch))
	for i, row := range batch {
		ids[i] = row.ID
	}
	switch req.Action {
	case bulkRetry:
		n, err := h.ops.RetryDead(ctx, h.cfg.DB, []string{queue}, ids, len(ids))
		if err != nil {
			return 0, nil, fmt.Errorf("retry %d tasks of %s: %w", len(ids), queue, err)
		}
		return n, map[string]int{skipNotDead: len(ids) - n}, nil
	case bulkPurge:
		res, err := h.ops.PurgeDead(ctx, h.cfg.DB, []string{queue}, ids, len(ids))
		if err != nil && res.Deleted == 0 {
			return 0, nil, fmt.Errorf("purge %d tasks of %s: %w", len(ids), queue, err)
		}
		return res.Deleted, map[string]int{skipNotDead: len(ids) - res.Deleted}, err
	}
	tx, err := h.cfg.DB.Begin(ctx)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	n, skipped := 0, map[string]int{}
	for _, id := range ids {
		if req.Action == bulkCancel {
			err = h.cfg.Outbox.Cancel(ctx, tx, queue, id)
		} else {
			err = h.cfg.Outbox.Reschedule(ctx, tx, queue, id, req.at)
		}
		switch {
		case err == nil:
			n++
		case errors.Is(err, outbox.ErrFinished):
			skipped[skipFinished]++
		case errors.Is(err, outbox.ErrNotFound):
			skipped[skipGone]++
		case errors.Is(err, validate.ErrInvalidStartBy):
			skipped[skipStartBy]++
		default:
			return 0, nil, fmt.Errorf("%s %s/%s: %w (its batch of %d rolled back)", req.Action.Label(), queue, id, err, len(ids))
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, nil, fmt.Errorf("%s %d tasks of %s: commit: %w", req.Action.Label(), len(ids), queue, err)
	}
	return n, skipped, nil
}
