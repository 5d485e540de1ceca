package ui

import (
	"errors"
	"net/http"

	"github.com/delayq/delayq/internal/notmigrated"
)

// notMigratedView is the page of a database whose migrations have not run.
type notMigratedView struct {
	What   string // `table "public.delayq_outbox"`
	Schema string
}

// notMigrated shows, in place of an error page, the page that says the
// migrations have not run and how to run them, when err says one of delayq's
// tables is missing; it reports whether it did. Every page and action fails
// through fail, so each shows it.
func (h *Handler) notMigrated(w http.ResponseWriter, p *page, err error) bool {
	var nm *notmigrated.Error
	if !errors.As(notmigrated.Classify(err), &nm) {
		return false
	}
	schema := h.opts.Schema
	if schema == "" {
		schema = "public"
	}
	p.Title, p.Error, p.Refresh = "Not migrated", nm.Error(), 0
	w.WriteHeader(http.StatusServiceUnavailable)
	h.render(w, p, "notmigrated", notMigratedView{What: nm.What, Schema: schema})
	return true
}
