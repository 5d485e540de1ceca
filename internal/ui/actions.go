package ui

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// Every action is a POST of a form with the CSRF token (checked by action), and
// goes through the project's own API; its redirect names a fixed message.

// back is where an action returns: the form's "back" when it is a path of the
// dashboard, else the given default.
func (h *Handler) back(r *http.Request, def string) string {
	b := r.PostForm.Get("back")
	if b == "" || !strings.HasPrefix(b, h.cfg.BasePath+"/") || strings.HasPrefix(b, "//") ||
		strings.ContainsAny(b, "\\\r\n") {
		return def
	}
	if u, err := url.Parse(b); err != nil || u.Scheme != "" || u.Host != "" {
		return def
	}
	return b
}

func (h *Handler) done(w http.ResponseWriter, r *http.Request, def, ok string) {
	to := h.back(r, def)
	sep := "?"
	if strings.Contains(to, "?") {
		sep = "&"
	}
	// Drop an earlier ok= so the messages do not pile up.
	if u, err := url.Parse(to); err == nil {
		q := u.Query()
		q.Del("ok")
		u.RawQuery = q.Encode()
		to, sep = u.String(), "?"
		if u.RawQuery != "" {
			sep = "&"
		}
	}
	http.Redirect(w, r, to+sep+"ok="+ok, http.StatusSeeOther)
}

func (h *Handler) taskURL(queue, id string) string {
	return h.cfg.BasePath + "/task?queue=" + url.QueryEscape(queue) + "&id=" + url.QueryEscape(id)
}

// key reads and validates the form's queue and id.
func key(r *http.Request) (string, string, error) {
	q, id := r.PostForm.Get("queue"), r.PostForm.Get("id")
	if err := errors.Join(validate.Queue(q), validate.TaskID(id)); err != nil {
		return "", "", err
	}
	return q, id, nil
}

func status(err error) int {
	switch {
	case errors.Is(err, outbox.ErrNotFound), errors.Is(err, reconcile.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, outbox.ErrFinished), errors.Is(err, reconcile.ErrNotDead):
		return http.StatusConflict
	}
	return http.StatusBadRequest
}

func (h *Handler) actCancel(w http.ResponseWriter, r *http.Request, p *page) {
	q, id, err := key(r)
	if err == nil {
		ctx, cancel := ctxOf(r)
		defer cancel()
		err = h.cfg.Outbox.Cancel(ctx, h.cfg.DB, q, id)
	}
	if err != nil {
		h.fail(w, p, status(err), err)
		return
	}
	h.done(w, r, h.taskURL(q, id), "cancelled")
}

// parseWhen reads a new due time: a delay from now ("10m", "1h30m", "0s") or a
// time (RFC 3339, or YYYY-MM-DD HH:MM[:SS] in UTC).
func parseWhen(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("delay %s: not negative", s)
		}
		return now.Add(d), nil
	}
	t, err := parseTime(s)
	if err == nil && t.IsZero() {
		err = errors.New("give a delay (10m) or a time (2026-01-02 15:04 UTC)")
	}
	return t, err
}

func (h *Handler) actReschedule(w http.ResponseWriter, r *http.Request, p *page) {
	q, id, err := key(r)
	var at time.Time
	if err == nil {
		at, err = parseWhen(r.PostForm.Get("when"), time.Now())
	}
	if err == nil {
		ctx, cancel := ctxOf(r)
		defer cancel()
		err = h.cfg.Outbox.Reschedule(ctx, h.cfg.DB, q, id, at)
	}
	if err != nil {
		h.fail(w, p, status(err), err)
		return
	}
	h.done(w, r, h.taskURL(q, id), "rescheduled")
}

// actRunNow reschedules a live task to now: a new version, due at once.
func (h *Handler) actRunNow(w http.ResponseWriter, r *http.Request, p *page) {
	q, id, err := key(r)
	if err == nil {
		ctx, cancel := ctxOf(r)
		defer cancel()
		err = h.cfg.Outbox.Reschedule(ctx, h.cfg.DB, q, id, time.Now())
	}
	if err != nil {
		h.fail(w, p, status(err), err)
		return
	}
	h.done(w, r, h.taskURL(q, id), "run-now")
}

func (h *Handler) actRetry(w http.ResponseWriter, r *http.Request, p *page) {
	q, id, err := key(r)
	if err == nil {
		ctx, cancel := ctxOf(r)
		defer cancel()
		err = reconcile.RetryDead(ctx, h.cfg.DB, h.opts, q, id)
	}
	if err != nil {
		h.fail(w, p, status(err), err)
		return
	}
	h.done(w, r, h.cfg.BasePath+"/dead", "retried")
}

func (h *Handler) actPurge(w http.ResponseWriter, r *http.Request, p *page) {
	q, id, err := key(r)
	if err == nil {
		ctx, cancel := ctxOf(r)
		defer cancel()
		err = reconcile.PurgeDeadTask(ctx, h.cfg.DB, h.cfg.Redis, h.opts, q, id)
	}
	if err != nil {
		h.fail(w, p, status(err), err)
		return
	}
	h.done(w, r, h.cfg.BasePath+"/dead", "purged")
}

type confirmData struct {
	Action, Queue, What string
}

// confirmed reports whether a bulk action on a queue was confirmed by typing the
// queue's name; if not, it shows the confirmation form.
func (h *Handler) confirmed(w http.ResponseWriter, r *http.Request, p *page, action, what string) (string, bool) {
	q := r.PostForm.Get("queue")
	if err := validate.Queue(q); err != nil {
		h.fail(w, p, http.StatusBadRequest, err)
		return "", false
	}
	if r.PostForm.Get("confirm") == q {
		return q, true
	}
	p.Title = "Confirm"
	if r.PostForm.Has("confirm") {
		p.Error = "The name typed is not the queue's: nothing was done."
	}
	h.render(w, p, "confirm", confirmData{Action: action, Queue: q, What: what})
	return "", false
}

func (h *Handler) actRetryAll(w http.ResponseWriter, r *http.Request, p *page) {
	q, ok := h.confirmed(w, r, p, "retry-all", "retry every dead task of")
	if !ok {
		return
	}
	ctx, cancel := ctxOf(r)
	defer cancel()
	opts := h.opts
	opts.Queues = []string{q}
	if _, err := reconcile.RetryAllDead(ctx, h.cfg.DB, opts); err != nil {
		h.fail(w, p, http.StatusBadGateway, err)
		return
	}
	h.done(w, r, h.cfg.BasePath+"/dead?queue="+url.QueryEscape(q), "retried-all")
}

func (h *Handler) actPurgeAll(w http.ResponseWriter, r *http.Request, p *page) {
	q, ok := h.confirmed(w, r, p, "purge-all", "delete, from both stores, every dead task of")
	if !ok {
		return
	}
	ctx, cancel := ctxOf(r)
	defer cancel()
	opts := h.opts
	opts.Queues = []string{q}
	if _, err := reconcile.PurgeDead(ctx, h.cfg.DB, h.cfg.Redis, opts); err != nil {
		h.fail(w, p, http.StatusBadGateway, err)
		return
	}
	h.done(w, r, h.cfg.BasePath+"/dead?queue="+url.QueryEscape(q), "purged-all")
}

// actCheck runs a consistency check: reconcile in dry run, which changes nothing.
func (h *Handler) actCheck(w http.ResponseWriter, r *http.Request, p *page) {
	ctx, cancel := ctxOf(r)
	defer cancel()
	opts := h.opts
	opts.DryRun = true
	start := time.Now()
	rep, err := reconcile.Reconcile(ctx, h.cfg.DB, h.cfg.Redis, opts)
	res := &checkResult{At: start, Report: rep}
	if err != nil {
		res.Err = err.Error()
	}
	res.Kinds = sortedKinds(rep)
	h.mu.Lock()
	h.lastCheck = res
	h.mu.Unlock()
	h.done(w, r, h.cfg.BasePath+"/consistency", "checked")
}

// actPause pauses or resumes a queue as delayq queue pause does: one control
// operation, Postgres (the truth) then Redis's copy at the new version.
func (h *Handler) actPause(paused bool) func(http.ResponseWriter, *http.Request, *page) {
	return func(w http.ResponseWriter, r *http.Request, p *page) {
		q := r.PostForm.Get("queue")
		if err := validate.Queue(q); err != nil {
			h.fail(w, p, http.StatusBadRequest, err)
			return
		}
		ctx, cancel := ctxOf(r)
		defer cancel()
		set, ok := h.queues.Resume, "resumed"
		if paused {
			set, ok = h.queues.Pause, "paused"
		}
		if _, err := set(ctx, q); err != nil {
			h.fail(w, p, http.StatusBadGateway, err)
			return
		}
		h.done(w, r, h.cfg.BasePath+"/", ok)
	}
}

// actEditRetry retries a dead task with the payload edited on its page, as a new
// version (outbox.RetryDeadEdited: only from the dead version the page showed).
// A payload that was JSON must still be JSON; it is stored compacted.
func (h *Handler) actEditRetry(w http.ResponseWriter, r *http.Request, p *page) {
	q, id, err := key(r)
	var version int
	if err == nil {
		version, err = strconv.Atoi(r.PostForm.Get("version"))
		if err != nil {
			err = fmt.Errorf("version %q: not a number", r.PostForm.Get("version"))
		}
	}
	payload := []byte(r.PostForm.Get("payload"))
	if err == nil && r.PostForm.Get("kind") == "json" {
		var buf bytes.Buffer
		if err = json.Compact(&buf, payload); err != nil {
			err = fmt.Errorf("%w: %w", errEditNotJSON, err)
		}
		payload = buf.Bytes()
	}
	if err == nil {
		ctx, cancel := ctxOf(r)
		defer cancel()
		_, err = h.cfg.Outbox.RetryDeadEdited(ctx, h.cfg.DB, q, id, version, payload)
	}
	if err != nil {
		code := status(err)
		if errors.Is(err, outbox.ErrStale) {
			code = http.StatusConflict
		}
		if errors.Is(err, errEditNotJSON) {
			code = http.StatusUnprocessableEntity
		}
		h.editRefused(w, r, p, q, id, code, err)
		return
	}
	h.done(w, r, h.taskURL(q, id), "edited")
}

// errEditNotJSON reports an edit of a JSON payload that is no longer JSON.
var errEditNotJSON = errors.New("the payload was JSON and the edit is not")

// editRefused shows the task's page again with the operator's text in the edit
// box and why it was refused beside it, so that nothing typed is lost. A form
// without a valid key has no page to go back to: the error page says why.
func (h *Handler) editRefused(w http.ResponseWriter, r *http.Request, p *page, q, id string, code int, cause error) {
	if q == "" {
		h.fail(w, p, code, cause)
		return
	}
	ctx, cancel := ctxOf(r)
	defer cancel()
	d, err := h.loadTask(ctx, q, id)
	if err != nil || !d.Found {
		h.fail(w, p, code, cause)
		return
	}
	p.Title = "Task " + d.ID
	d.EditText, d.EditError = r.PostForm.Get("payload"), cause.Error()
	w.WriteHeader(code)
	h.render(w, p, "task", d)
}
