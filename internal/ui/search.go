package ui

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A search by payload, and a sort no index serves, read rows of the outbox
// beyond a page: each is bounded so that it cannot hurt the database, whatever
// the table holds, and the page says so.
const (
	// searchScanRows is the most rows of the queue one page of a search reads
	// (in id order; the next page goes on from there).
	// 10,000 rows of a queue of 50,000 among 1,000,000 read in about 90 ms
	// (BENCHMARKS.md, "Dashboard render times").
	searchScanRows = 10_000
	// queryTimeLimit is the longest a search step or a sort without an index may
	// run: the statement is cancelled then (statement_timeout). It keeps every
	// page within its budget of 200 ms.
	queryTimeLimit = 120 * time.Millisecond
)

// bounded runs fn in a read-only transaction whose statements are cancelled
// after queryTimeLimit. A cancelled statement is errTooLong.
func (h *Handler) bounded(ctx context.Context, fn func(pgx.Tx) error) error {
	return h.boundedBy(ctx, queryTimeLimit, fn)
}

// boundedBy is bounded with a statement timeout of limit.
func (h *Handler) boundedBy(ctx context.Context, limit time.Duration, fn func(pgx.Tx) error) error {
	tx, err := h.cfg.DB.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", limit.Milliseconds())); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "SET TRANSACTION READ ONLY"); err != nil {
		return err
	}
	err = fn(tx)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "57014" { // query_canceled: the statement timeout
		return errTooLong
	}
	return err
}

var errTooLong = fmt.Errorf("stopped at the time limit of %v, so as not to load the database: narrow the list (a state, a due window) or search a field with an index (docs/DESIGN.md, \"The dashboard's sorts and search\")", queryTimeLimit)

// jsonQuery is a search by payload: the value at a JSON path.
type jsonQuery struct {
	path []string // object keys, or array indexes
	want any      // a string, json.Number, bool or nil
	// needle is text the payload holds when it matches (the value as JSON
	// writes it): the database reads for it, and each row found is then
	// checked exactly here.
	needle []byte
}

// parseJSONQuery reads a path ("customer.id", "$.items[0].sku", "items.0.sku")
// and a value: JSON (42, true, null, "text") or, if not JSON, a string.
func parseJSONQuery(path, value string) (jsonQuery, error) {
	var q jsonQuery
	p := strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(path), "$"), ".")
	p = strings.NewReplacer("[", ".", "]", "").Replace(p)
	if p == "" {
		return q, errors.New("give a JSON path (customer.id, items[0].sku) and a value")
	}
	q.path = strings.Split(p, ".")
	for _, k := range q.path {
		if k == "" {
			return q, fmt.Errorf("JSON path %q: an empty step", path)
		}
	}
	d := json.NewDecoder(strings.NewReader(value))
	d.UseNumber()
	if err := d.Decode(&q.want); err != nil || d.More() {
		q.want = value
	}
	switch w := q.want.(type) {
	case string:
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(w)
		q.needle = bytes.TrimSuffix(bytes.TrimSuffix(bytes.TrimPrefix(buf.Bytes(), []byte(`"`)), []byte("\n")), []byte(`"`))
	case json.Number:
		q.needle = []byte(w.String())
	case bool:
		q.needle = []byte(strconv.FormatBool(w))
	case nil:
		q.needle = []byte("null")
	default:
		return q, errors.New("the value is a JSON object or array: search a field inside it")
	}
	if len(q.needle) == 0 {
		return q, errors.New("give a value to search for")
	}
	return q, nil
}

// matches reports whether payload is JSON whose value at q's path is q's value.
func (q jsonQuery) matches(payload []byte) bool {
	d := json.NewDecoder(bytes.NewReader(payload))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return false
	}
	for _, k := range q.path {
		switch c := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = c[k]; !ok {
				return false
			}
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i < 0 || i >= len(c) {
				return false
			}
			v = c[i]
		default:
			return false
		}
	}
	switch w := q.want.(type) {
	case json.Number:
		g, ok := v.(json.Number)
		if !ok {
			return false
		}
		if g == w {
			return true
		}
		gf, err1 := g.Float64()
		wf, err2 := w.Float64()
		return err1 == nil && err2 == nil && gf == wf
	default:
		return v == q.want
	}
}
