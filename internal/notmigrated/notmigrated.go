// Package notmigrated tells a database whose migrations have not run from
// other failures: a statement on one of delayq's tables that PostgreSQL
// answers with undefined_table (42P01), or undefined schema (3F000), becomes
// an error for which errors.Is(err, Err) holds, with the fix in its text.
//
// Every entry point a user calls (enqueue, the client's admin calls, the
// dashboard, the CLI) passes its errors through Classify, so an unmigrated
// schema reads the same everywhere. Classify only describes the error: the
// statement failed and wrote nothing, and a caller's transaction is left as
// PostgreSQL left it (aborted), exactly as with the raw error.
package notmigrated

import (
	"errors"
	"strings"
)

// Hint is the fix, as the messages end with it.
const Hint = "(run the migrations: delayq migrate up)"

// Err is the sentinel (outbox.ErrNotMigrated is this value).
var Err = errors.New("delayq table not found " + Hint)

// Error is a missing table or schema of delayq's, named as PostgreSQL named
// it. It wraps the server's error, and errors.Is(e, Err) holds.
type Error struct {
	// What is missing: `table "public.delayq_outbox"` or `schema "tenant"`.
	What string
	// context is what the callers wrapped the server's error in ("outbox:
	// enqueue q/id: "), kept in front.
	context string
	err     error
}

func (e *Error) Error() string { return e.context + e.What + " not found " + Hint }

// Unwrap returns the server's error (nil when a check found the table gone).
func (e *Error) Unwrap() error { return e.err }

// Is reports whether target is Err.
func (e *Error) Is(target error) bool { return target == Err }

// Table is the error of a check that found the table missing, named
// schema-qualified, quoted or not (`"public"."delayq_outbox"` reads as
// PostgreSQL's own message would: "public.delayq_outbox").
func Table(table string) error {
	return &Error{What: `table "` + strings.ReplaceAll(table, `"`, "") + `"`}
}

// sqlStater is *pgconn.PgError and the database/sql drivers' errors (lib/pq's
// *pq.Error) alike.
type sqlStater interface {
	error
	SQLState() string
}

// Classify returns err as an *Error when PostgreSQL refused the statement
// because one of delayq's tables (delayq_*) or the schema does not exist;
// otherwise err itself (nil stays nil). Only errors of delayq's own statements
// should pass through it: a missing schema is taken as delayq's.
func Classify(err error) error {
	if err == nil || errors.Is(err, Err) {
		return err
	}
	var se sqlStater
	if !errors.As(err, &se) {
		return err
	}
	msg := se.Error()
	var what string
	switch se.SQLState() {
	case "42P01": // undefined_table
		if !strings.Contains(msg, "delayq_") {
			return err
		}
		what = strings.TrimSpace("table " + quoted(msg, "delayq_"))
	case "3F000": // invalid_schema_name
		what = strings.TrimSpace("schema " + quoted(msg, ""))
	default:
		return err
	}
	// The wrapping's words stay, the server's are replaced.
	context, ok := strings.CutSuffix(err.Error(), msg)
	if !ok {
		context = ""
	}
	return &Error{What: what, context: context, err: err}
}

// quoted returns the first double-quoted name in msg that holds must, quotes
// included, or "" when there is none (a server speaking another language).
func quoted(msg, must string) string {
	for rest := msg; ; {
		_, after, ok := strings.Cut(rest, `"`)
		if !ok {
			return ""
		}
		name, tail, ok := strings.Cut(after, `"`)
		if !ok {
			return ""
		}
		if strings.Contains(name, must) {
			return `"` + name + `"`
		}
		rest = tail
	}
}
