package delayq

import (
	"cmp"
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// confRec is what a conformance script observed: values read, command tags and
// errors, in order. run tags the rows the script writes.
type confRec struct {
	run   string
	out   []string
	first error // the first error checked: what a handler would return
}

func (r *confRec) add(format string, args ...any) {
	r.out = append(r.out, fmt.Sprintf(format, args...))
}

// check records err under what and keeps the first error.
func (r *confRec) check(what string, err error) {
	r.add("%s: %s", what, confErr(err))
	r.first = cmp.Or(r.first, err)
}

// confErr describes an error by everything a caller can see of it: its text (with
// the SQLSTATE) and, for a server error, the position it points at.
func confErr(err error) string {
	if err == nil {
		return "ok"
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return fmt.Sprintf("%v [position %d]", err, pe.Position)
	}
	return err.Error()
}

const (
	confInsert = `INSERT INTO conf (run, n, label) VALUES ($1, $2, $3)`
	confSelect = `SELECT n, label FROM conf WHERE run = $1 ORDER BY n`
)

// ins inserts row n and records the outcome.
func (r *confRec) ins(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, n int, label string) {
	tag, err := db.Exec(ctx, confInsert, r.run, n, label)
	r.check(fmt.Sprintf("insert %d %q (%s)", n, label, tag), err)
}

// lit is SQL with the run's id written in (for statements without arguments).
func (r *confRec) lit(format string) string { return strings.ReplaceAll(format, "RUN", "'"+r.run+"'") }

// rows records what a Query returned: its rows, its error, its command tag.
func (r *confRec) rows(what string, rows pgx.Rows, err error) {
	r.check(what+" query", err)
	if rows == nil {
		r.add("%s: nil rows", what)
		return
	}
	for rows.Next() {
		vals, err := rows.Values()
		r.check(fmt.Sprintf("%s row %v", what, vals), err)
	}
	rows.Close()
	r.check(what+" rows ("+rows.CommandTag().String()+")", rows.Err())
}

// confScript is a transactional handler's body, run on both kinds of transaction.
// It returns what the handler returns: nil to commit.
type confScript struct {
	name string
	run  func(ctx context.Context, tx pgx.Tx, r *confRec) error
	// differs are the execution modes where the handler's transaction is known
	// to differ (see the script): there it must commit what the pgx.Tx did, or
	// nothing.
	differs []string
}

// confBadArg is an argument pgx fails to encode.
type confBadArg struct{}

func (confBadArg) Value() (driver.Value, error) { return nil, errors.New("no value") }

var confScripts = []confScript{{
	name: "nothing",
	run:  func(context.Context, pgx.Tx, *confRec) error { return nil },
}, {
	name: "an error without a statement",
	run:  func(context.Context, pgx.Tx, *confRec) error { return errors.New("failed") },
}, {
	name: "exec",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		r.ins(ctx, tx, 1, "a")
		tag, err := tx.Exec(ctx, `INSERT INTO conf (run, n, label) VALUES (@run, 2, @label)`,
			pgx.NamedArgs{"run": r.run, "label": "named"})
		r.check("named args "+tag.String(), err)
		tag, err = tx.Exec(ctx, `UPDATE conf SET label = label || '!' WHERE run = $1`, pgx.QueryExecModeExec, r.run)
		r.check("exec mode "+tag.String(), err)
		return r.first
	},
}, {
	name: "exec without arguments, two statements",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		tag, err := tx.Exec(ctx, r.lit(`INSERT INTO conf VALUES (RUN, 1, 'a'); INSERT INTO conf VALUES (RUN, 2, 'b')`))
		r.check("exec "+tag.String(), err)
		return r.first
	},
}, {
	name: "exec error, then more",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		r.ins(ctx, tx, 1, "a")
		r.ins(ctx, tx, 1, "duplicate")
		r.ins(ctx, tx, 2, "after")
		return r.first
	},
}, {
	name: "syntax error first, no arguments",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		_, err := tx.Exec(ctx, r.lit(`INSERT INTO conf VALUES (RUN, 1, 'a'`))
		r.check("exec", err)
		r.ins(ctx, tx, 2, "after")
		return r.first
	},
}, {
	name: "syntax error first, with arguments",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		_, err := tx.Exec(ctx, `INSERT INTO conf VALUES ($1, 1, 'a'`, r.run)
		r.check("exec", err)
		r.ins(ctx, tx, 2, "after")
		return r.first
	},
}, {
	name: "undefined table first",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		_, err := tx.Exec(ctx, `INSERT INTO nosuch VALUES ($1)`, r.run)
		r.check("exec", err)
		r.ins(ctx, tx, 2, "after")
		return r.first
	},
}, {
	name: "undefined column first, no arguments",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		_, err := tx.Exec(ctx, `SELECT nosuch FROM conf`)
		r.check("exec", err)
		return r.first
	},
}, {
	name: "undefined column first, with arguments",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		_, err := tx.Exec(ctx, `SELECT nosuch FROM conf WHERE run = $1`, r.run)
		r.check("exec", err)
		return r.first
	},
}, {
	// A handler that swallows an error and returns nil commits nothing: its
	// transaction is aborted.
	name: "error swallowed, no arguments",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		_, err := tx.Exec(ctx, r.lit(`INSERT INTO conf VALUES (RUN, 1, 'a'`))
		r.check("exec", err)
		r.ins(ctx, tx, 2, "after")
		return nil
	},
}, {
	name: "error swallowed, with arguments",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		_, err := tx.Exec(ctx, `INSERT INTO nosuch VALUES ($1)`, r.run)
		r.check("exec", err)
		r.ins(ctx, tx, 2, "after")
		return nil
	},
}, {
	name: "an argument pgx cannot encode",
	// pgx encodes a batch's arguments after it queued the ones before: an error
	// there closes the connection, with BEGIN queued ahead in the pipeline of
	// the extended protocol's batches. Nothing ran; the handler sees the same
	// error; its run fails (it cannot go on as in a pgx.Tx, where the error
	// leaves the transaction alone).
	differs: []string{"cache_statement", "cache_describe", "describe_exec"},
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		tag, err := tx.Exec(ctx, confInsert, r.run, confBadArg{}, "x")
		r.add("exec %s: %s", tag, confErr(err)) // fails before anything is sent
		rows, err := tx.Query(ctx, `SELECT $1::int`, confBadArg{})
		r.add("query: %s", confErr(err))
		r.add("rows: %s", confErr(rows.Err()))
		rows.Close()
		r.ins(ctx, tx, 1, "after")
		return r.first
	},
}, {
	name: "a word that is no statement",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		_, err := tx.Exec(ctx, "conf_nosuch")
		r.check("exec", err)
		r.ins(ctx, tx, 2, "after")
		return r.first
	},
}, {
	name: "query",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		rows, err := tx.Query(ctx, `INSERT INTO conf (run, n, label)
			SELECT $1, x, 'q' || x FROM generate_series(1, 3) x RETURNING n, label`, r.run)
		r.rows("insert returning", rows, err)
		rows, err = tx.Query(ctx, confSelect, r.run)
		r.rows("select", rows, err)
		rows, err = tx.Query(ctx, r.lit(`SELECT count(*) FROM conf WHERE run = RUN`))
		r.rows("without arguments", rows, err)
		return r.first
	},
}, {
	name: "query collected",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		rows, _ := tx.Query(ctx, `SELECT x FROM generate_series(1, $1::int) x`, 3)
		got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		r.check(fmt.Sprintf("collect %v", got), err)
		r.ins(ctx, tx, 1, "after")
		return r.first
	},
}, {
	name: "query error mid-way",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		rows, err := tx.Query(ctx, `SELECT 10 / ($1::int - x) FROM generate_series(1, 5) x`, 3)
		r.rows("division", rows, err)
		r.ins(ctx, tx, 1, "after")
		return r.first
	},
}, {
	name: "query error at once",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		rows, err := tx.Query(ctx, `SELECT * FROM nosuch WHERE a = $1`, 1)
		r.rows("undefined table", rows, err)
		r.ins(ctx, tx, 1, "after")
		return r.first
	},
}, {
	name: "query error, rows collected anyway",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		rows, _ := tx.Query(ctx, `SELECT * FROM nosuch WHERE a = $1`, 1)
		got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		r.check(fmt.Sprintf("collect %v", got), err)
		r.ins(ctx, tx, 1, "after")
		return r.first
	},
}, {
	name: "query duplicate key",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		r.ins(ctx, tx, 1, "a")
		rows, err := tx.Query(ctx, confInsert+` RETURNING n`, r.run, 1, "duplicate")
		r.rows("insert returning", rows, err)
		return r.first
	},
}, {
	name: "query row",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		var label string
		err := tx.QueryRow(ctx, confInsert+` RETURNING label`, r.run, 1, "row").Scan(&label)
		r.check("insert returning "+label, err)
		err = tx.QueryRow(ctx, `SELECT label FROM conf WHERE run = $1 AND n = 2`, r.run).Scan(&label)
		r.check("no row", err)
		var n int
		err = tx.QueryRow(ctx, r.lit(`SELECT count(*) FROM conf WHERE run = RUN`)).Scan(&n)
		r.check(fmt.Sprintf("count %d", n), err)
		return r.first
	},
}, {
	name: "query row without a row first",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		var label string
		err := tx.QueryRow(ctx, `SELECT label FROM conf WHERE run = $1`, r.run).Scan(&label)
		r.check("no row", err)
		r.ins(ctx, tx, 1, "after")
		return r.first
	},
}, {
	name: "query row scan error",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		var n int
		err := tx.QueryRow(ctx, `SELECT $1::text`, "not a number").Scan(&n)
		r.check("scan", err)
		r.ins(ctx, tx, 1, "after")
		return nil // a client-side error leaves the transaction alone
	},
}, {
	name: "query rows scan error",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		rows, err := tx.Query(ctx, `SELECT $1::text`, "not a number")
		r.check("query", err)
		for rows.Next() {
			var n int
			r.check("scan", rows.Scan(&n))
			break // no Close: the scan error closed the rows
		}
		r.ins(ctx, tx, 1, "after")
		rows.Close()
		return nil
	},
}, {
	name: "query row error",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		var n int
		err := tx.QueryRow(ctx, `SELECT a FROM nosuch WHERE a = $1`, 1).Scan(&n)
		r.check("scan", err)
		r.ins(ctx, tx, 1, "after")
		return r.first
	},
}, {
	// Statements prepared on connect (confPool) are used first, before the
	// transaction has begun: a name of one word, and names with spaces.
	name: "prepared on connect, a name first",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		tag, err := tx.Exec(ctx, "conf_pre_ins", r.run, 1, "one word")
		r.check("exec "+tag.String(), err)
		return r.first
	},
}, {
	name: "prepared on connect, a name with spaces first",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		tag, err := tx.Exec(ctx, "conf pre ins", r.run, 1, "spaced")
		r.check("exec "+tag.String(), err)
		var n int
		err = tx.QueryRow(ctx, "conf pre answer").Scan(&n)
		r.check(fmt.Sprintf("query row %d", n), err)
		return r.first
	},
}, {
	name: "prepared on connect, without arguments first",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		tag, err := tx.Exec(ctx, "conf pre answer")
		r.check("exec "+tag.String(), err)
		r.ins(ctx, tx, 1, "after")
		return r.first
	},
}, {
	name: "prepared on connect, query first",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		rows, err := tx.Query(ctx, "conf pre count", r.run)
		r.rows("count", rows, err)
		r.ins(ctx, tx, 1, "after")
		return r.first
	},
}, {
	name: "prepared on connect, query row first",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		var n int
		err := tx.QueryRow(ctx, "conf_pre_count", r.run).Scan(&n)
		r.check(fmt.Sprintf("count %d", n), err)
		r.ins(ctx, tx, 1, "after")
		return r.first
	},
}, {
	name: "prepared on connect, in a batch first",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		bt := &pgx.Batch{}
		bt.Queue("conf pre ins", r.run, 1, "b1")
		bt.Queue("conf_pre_ins", r.run, 2, "b2")
		r.check("batch", tx.SendBatch(ctx, bt).Close())
		r.ins(ctx, tx, 3, "after")
		return r.first
	},
}, {
	name: "prepare, then by name and by SQL",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		sd, err := tx.Prepare(ctx, "conf_ins", confInsert)
		r.check("prepare", err)
		if sd != nil {
			r.add("%d parameters", len(sd.ParamOIDs))
		}
		tag, err := tx.Exec(ctx, "conf_ins", r.run, 1, "by name")
		r.check("exec by name "+tag.String(), err)
		tag, err = tx.Exec(ctx, confInsert, r.run, 2, "by sql")
		r.check("exec by sql "+tag.String(), err)
		_, err = tx.Prepare(ctx, "conf_sel", confSelect)
		r.check("prepare select", err)
		rows, err := tx.Query(ctx, "conf_sel", r.run)
		r.rows("query by name", rows, err)
		var label string
		err = tx.QueryRow(ctx, "conf_sel", r.run).Scan(new(int), &label)
		r.check("query row by name "+label, err)
		return r.first
	},
}, {
	name: "prepare, then by name without arguments",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		_, err := tx.Prepare(ctx, "conf_fixed", r.lit(`INSERT INTO conf VALUES (RUN, 1, 'fixed')`))
		r.check("prepare", err)
		tag, err := tx.Exec(ctx, "conf_fixed")
		r.check("exec by name "+tag.String(), err)
		return r.first
	},
}, {
	name: "prepare, then by name in a batch",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		_, err := tx.Prepare(ctx, "conf_bins", confInsert)
		r.check("prepare", err)
		bt := &pgx.Batch{}
		bt.Queue("conf_bins", r.run, 1, "batch by name")
		r.check("batch", tx.SendBatch(ctx, bt).Close())
		return r.first
	},
}, {
	name: "prepare, a name with spaces",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		_, err := tx.Prepare(ctx, "conf spaced ins", confInsert)
		r.check("prepare", err)
		tag, err := tx.Exec(ctx, "conf spaced ins", r.run, 1, "spaced")
		r.check("exec "+tag.String(), err)
		_, err = tx.Prepare(ctx, "conf spaced fixed", r.lit(`INSERT INTO conf VALUES (RUN, 2, 'fixed')`))
		r.check("prepare", err)
		tag, err = tx.Exec(ctx, "conf spaced fixed")
		r.check("exec without arguments "+tag.String(), err)
		var n int
		err = tx.QueryRow(ctx, "conf spaced count", r.run).Scan(&n)
		r.check("query row by an unknown name", err)
		return r.first
	},
}, {
	name: "prepare, name is the SQL",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		sql := `INSERT INTO conf (run, n, label) VALUES ($1, $2, 'same')`
		_, err := tx.Prepare(ctx, sql, sql)
		r.check("prepare", err)
		tag, err := tx.Exec(ctx, sql, r.run, 1)
		r.check("exec "+tag.String(), err)
		return r.first
	},
}, {
	name: "prepare twice",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		_, err := tx.Prepare(ctx, "conf_twice", confInsert)
		r.check("prepare", err)
		_, err = tx.Prepare(ctx, "conf_twice", confInsert)
		r.check("prepare again", err)
		r.ins(ctx, tx, 1, "between")
		_, err = tx.Prepare(ctx, "conf_twice", confSelect)
		r.check("prepare other SQL", err)
		r.ins(ctx, tx, 2, "after")
		return r.first
	},
}, {
	name: "prepare error",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		_, err := tx.Prepare(ctx, "conf_bad", `INSERT INTO conf VALUES ($1, 1, 'a'`)
		r.check("prepare", err)
		r.ins(ctx, tx, 2, "after")
		return r.first
	},
}, {
	name: "prepare error swallowed",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		_, err := tx.Prepare(ctx, "conf_bad2", `SELECT * FROM nosuch`)
		r.check("prepare", err)
		r.ins(ctx, tx, 2, "after")
		return nil
	},
}, {
	name: "copy",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		n, err := tx.CopyFrom(ctx, pgx.Identifier{"conf"}, []string{"run", "n", "label"},
			pgx.CopyFromRows([][]any{{r.run, 1, "c1"}, {r.run, 2, "c2"}}))
		r.check(fmt.Sprintf("copy %d", n), err)
		r.ins(ctx, tx, 3, "after")
		return r.first
	},
}, {
	name: "copy duplicate key",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		r.ins(ctx, tx, 1, "a")
		n, err := tx.CopyFrom(ctx, pgx.Identifier{"conf"}, []string{"run", "n", "label"},
			pgx.CopyFromRows([][]any{{r.run, 2, "c2"}, {r.run, 1, "c1"}}))
		r.check(fmt.Sprintf("copy %d", n), err)
		r.ins(ctx, tx, 3, "after")
		return r.first
	},
}, {
	name: "copy into no table",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		n, err := tx.CopyFrom(ctx, pgx.Identifier{"nosuch"}, []string{"a"}, pgx.CopyFromRows([][]any{{1}}))
		r.check(fmt.Sprintf("copy %d", n), err)
		r.ins(ctx, tx, 1, "after")
		return r.first
	},
}, {
	name: "batch",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		bt := &pgx.Batch{}
		bt.Queue(confInsert, r.run, 1, "b1")
		bt.Queue(`INSERT INTO conf (run, n, label) VALUES (@run, 2, 'b2')`, pgx.NamedArgs{"run": r.run})
		bt.Queue(`SELECT count(*) FROM conf WHERE run = $1`, r.run)
		bt.Queue(confSelect, r.run)
		br := tx.SendBatch(ctx, bt)
		r.add("batch tx %v", br.Tx() != nil)
		for i := range 2 {
			tag, err := br.Exec()
			r.check(fmt.Sprintf("result %d %s", i, tag), err)
		}
		var n int
		r.check("count", br.QueryRow().Scan(&n))
		r.add("count %d", n)
		rows, err := br.Query()
		r.rows("select", rows, err)
		r.check("close", br.Close())
		return r.first
	},
}, {
	name: "batch with a failing statement",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		bt := &pgx.Batch{}
		bt.Queue(confInsert, r.run, 1, "b1")
		bt.Queue(confInsert, r.run, 1, "duplicate")
		bt.Queue(confInsert, r.run, 2, "b2")
		br := tx.SendBatch(ctx, bt)
		for i := range 3 {
			tag, err := br.Exec()
			r.check(fmt.Sprintf("result %d %s", i, tag), err)
		}
		r.check("close", br.Close())
		r.ins(ctx, tx, 3, "after")
		return r.first
	},
}, {
	name: "batch with an undefined table",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		bt := &pgx.Batch{}
		bt.Queue(confInsert, r.run, 1, "b1")
		bt.Queue(`INSERT INTO nosuch VALUES ($1)`, r.run)
		br := tx.SendBatch(ctx, bt)
		for i := range 2 {
			tag, err := br.Exec()
			r.check(fmt.Sprintf("result %d %s", i, tag), err)
		}
		r.check("close", br.Close())
		r.ins(ctx, tx, 3, "after")
		return r.first
	},
}, {
	name: "batch callbacks",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		bt := &pgx.Batch{}
		bt.Queue(confInsert, r.run, 1, "b1").Exec(func(tag pgconn.CommandTag) error {
			r.add("callback 1 %s", tag)
			return nil
		})
		bt.Queue(`SELECT label FROM conf WHERE run = $1`, r.run).QueryRow(func(row pgx.Row) error {
			var s string
			err := row.Scan(&s)
			r.add("callback 2 %s %s", s, confErr(err))
			return err
		})
		bt.Queue(`INSERT INTO nosuch VALUES ($1)`, r.run).Exec(func(tag pgconn.CommandTag) error {
			r.add("callback 3 %s", tag)
			return nil
		})
		r.check("close", tx.SendBatch(ctx, bt).Close())
		r.ins(ctx, tx, 3, "after")
		return r.first
	},
}, {
	name: "batch callbacks, syntax error",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		bt := &pgx.Batch{}
		bt.Queue(confInsert, r.run, 1, "b1").Exec(func(tag pgconn.CommandTag) error {
			r.add("callback 1 %s", tag)
			return nil
		})
		bt.Queue(`INSERT INTO conf VALUES ($1, 2, 'b2'`, r.run).Exec(func(tag pgconn.CommandTag) error {
			r.add("callback 2 %s", tag)
			return nil
		})
		r.check("close", tx.SendBatch(ctx, bt).Close())
		r.ins(ctx, tx, 3, "after")
		return r.first
	},
}, {
	name: "batch syntax error",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		bt := &pgx.Batch{}
		bt.Queue(confInsert, r.run, 1, "b1")
		bt.Queue(`INSERT INTO conf VALUES ($1, 2, 'b2'`, r.run)
		r.check("close", tx.SendBatch(ctx, bt).Close())
		r.ins(ctx, tx, 3, "after")
		return r.first
	},
}, {
	name: "batch that begins a transaction",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		bt := &pgx.Batch{}
		bt.BeginTx(pgx.TxOptions{})
		bt.Queue(confInsert, r.run, 1, "b1")
		br := tx.SendBatch(ctx, bt)
		_, err := br.Exec()
		r.check("begin", err)
		r.check("close", br.Close())
		r.ins(ctx, tx, 2, "after")
		return r.first
	},
}, {
	name: "empty batch",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		br := tx.SendBatch(ctx, &pgx.Batch{})
		_, err := br.Exec()
		r.add("exec: %s", confErr(err))
		r.check("close", br.Close())
		r.ins(ctx, tx, 1, "after")
		return r.first
	},
}, {
	name: "savepoint committed",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		r.ins(ctx, tx, 1, "outer")
		sp, err := tx.Begin(ctx)
		r.check("begin", err)
		r.ins(ctx, sp, 2, "inner")
		r.check("commit", sp.Commit(ctx))
		r.check("commit again", sp.Commit(ctx))
		r.ins(ctx, tx, 3, "after")
		return r.first
	},
}, {
	name: "savepoint rolled back",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		r.ins(ctx, tx, 1, "outer")
		sp, err := tx.Begin(ctx)
		r.check("begin", err)
		r.ins(ctx, sp, 2, "inner")
		r.check("rollback", sp.Rollback(ctx))
		_, err = sp.Exec(ctx, confInsert, r.run, 9, "closed")
		r.check("exec on the closed savepoint", err)
		r.first = nil // ErrTxClosed, expected
		r.ins(ctx, tx, 3, "after")
		return r.first
	},
}, {
	name: "savepoint first",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		sp, err := tx.Begin(ctx)
		r.check("begin", err)
		r.ins(ctx, sp, 1, "inner")
		r.check("rollback", sp.Rollback(ctx))
		r.ins(ctx, tx, 2, "after")
		return r.first
	},
}, {
	name: "savepoints nested two levels",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		sp1, err := tx.Begin(ctx)
		r.check("begin 1", err)
		r.ins(ctx, sp1, 1, "level 1")
		sp2, err := sp1.Begin(ctx)
		r.check("begin 2", err)
		r.ins(ctx, sp2, 2, "level 2 committed")
		r.check("commit 2", sp2.Commit(ctx))
		sp2, err = sp1.Begin(ctx)
		r.check("begin 2 again", err)
		r.ins(ctx, sp2, 3, "level 2 rolled back")
		r.check("rollback 2", sp2.Rollback(ctx))
		r.check("commit 1", sp1.Commit(ctx))
		sp1, err = tx.Begin(ctx)
		r.check("begin 1 again", err)
		sp2, err = sp1.Begin(ctx)
		r.check("begin 2 in it", err)
		r.ins(ctx, sp2, 4, "inside a rolled back level 1")
		r.check("commit 2", sp2.Commit(ctx))
		r.check("rollback 1", sp1.Rollback(ctx))
		r.ins(ctx, tx, 5, "after")
		return r.first
	},
}, {
	name: "savepoint recovers from an error",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		r.ins(ctx, tx, 1, "outer")
		sp, err := tx.Begin(ctx)
		r.check("begin", err)
		r.ins(ctx, sp, 1, "duplicate")
		r.ins(ctx, sp, 2, "aborted")
		r.check("rollback", sp.Rollback(ctx))
		r.ins(ctx, tx, 3, "after")
		return nil // the savepoint undid the error
	},
}, {
	name: "savepoint after an error",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		r.ins(ctx, tx, 1, "a")
		r.ins(ctx, tx, 1, "duplicate")
		sp, err := tx.Begin(ctx)
		r.check("begin", err)
		r.add("savepoint %v", sp != nil)
		return r.first
	},
}, {
	name: "BeginFunc",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		r.check("kept", pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			r.ins(ctx, sp, 1, "kept")
			return nil
		}))
		err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			r.ins(ctx, sp, 2, "undone")
			return errors.New("undo")
		})
		r.add("undone: %s", confErr(err))
		r.ins(ctx, tx, 3, "after")
		return r.first
	},
}, {
	name: "large objects",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		confLargeObject(ctx, tx, r)
		return r.first
	},
}, {
	name: "large objects after a statement",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		r.ins(ctx, tx, 1, "before")
		confLargeObject(ctx, tx, r)
		return r.first
	},
}, {
	name: "large objects after an error",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		r.ins(ctx, tx, 1, "a")
		r.ins(ctx, tx, 1, "duplicate")
		lo := tx.LargeObjects()
		_, err := lo.Create(ctx, 0)
		r.check("create", err)
		return r.first
	},
}, {
	name: "conn",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		c := tx.Conn()
		r.add("status %c", c.PgConn().TxStatus())
		r.ins(ctx, c, 1, "on the connection")
		r.ins(ctx, tx, 2, "on the transaction")
		return r.first
	},
}, {
	name: "conn after a statement",
	run: func(ctx context.Context, tx pgx.Tx, r *confRec) error {
		r.ins(ctx, tx, 1, "on the transaction")
		var n int
		err := tx.Conn().QueryRow(ctx, `SELECT count(*) FROM conf WHERE run = $1`, r.run).Scan(&n)
		r.check(fmt.Sprintf("count %d", n), err)
		return r.first
	},
}}

// confLargeObject writes a large object, reads it back, and records its id in
// conf_lo so that the committed content can be compared.
func confLargeObject(ctx context.Context, tx pgx.Tx, r *confRec) {
	lo := tx.LargeObjects()
	oid, err := lo.Create(ctx, 0)
	r.check("create", err)
	if err != nil {
		return
	}
	obj, err := lo.Open(ctx, oid, pgx.LargeObjectModeRead|pgx.LargeObjectModeWrite)
	r.check("open", err)
	if err != nil {
		return
	}
	n, err := obj.Write([]byte("large " + r.run[1:]))
	r.check(fmt.Sprintf("write %d", n), err)
	_, err = obj.Seek(0, io.SeekStart)
	r.check("seek", err)
	buf := make([]byte, 64)
	n, err = obj.Read(buf)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	r.check(fmt.Sprintf("read %q", buf[:n]), err)
	r.check("close", obj.Close())
	_, err = tx.Exec(ctx, `INSERT INTO conf_lo (run, lo) VALUES ($1, $2)`, r.run, oid)
	r.check("record", err)
}

// confCommitted is what a run left committed: its rows in conf and its large
// objects' contents.
func confCommitted(t *testing.T, b *bundle, run string) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `
		SELECT n, label FROM conf WHERE run = $1
		UNION ALL
		SELECT 100, convert_from(lo_get(lo), 'UTF8') FROM conf_lo WHERE run = $1
		ORDER BY 1`, run)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
		var n int
		var label string
		err := row.Scan(&n, &label)
		return fmt.Sprintf("%d %s", n, label), err
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// confPool opens a pool on url whose connections prepare statements when they
// connect, as applications do in pgxpool.Config.AfterConnect.
func confPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		for name, sql := range map[string]string{
			"conf_pre_ins":    confInsert,
			"conf pre ins":    confInsert,
			"conf pre answer": `SELECT 42`,
			"conf pre count":  `SELECT count(*) FROM conf WHERE run = $1`,
			"conf_pre_count":  `SELECT count(*) FROM conf WHERE run = $1`,
		} {
			if _, err := c.Prepare(ctx, name, sql); err != nil {
				return err
			}
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// confRun runs script s, turning a panic into an error that it records.
func confRun(ctx context.Context, s confScript, tx pgx.Tx, r *confRec) (err error) {
	defer func() {
		if v := recover(); v != nil {
			r.add("panic: %v", v)
			err = fmt.Errorf("panic: %v", v)
		}
	}()
	return s.run(ctx, tx, r)
}

// The transaction a TxHandler gets behaves as a pgx.Tx begun on a pool: each
// script runs as a real task's handler, and on a transaction from pool.Begin that
// is committed when the script returns nil and rolled back otherwise (as the
// worker does). Both must observe the same values, errors and command tags, and
// leave the same rows committed. In every query execution mode pgx has, the simple
// protocol among them (PgBouncer's transaction pooling), and in a group commit,
// where the handler's first statement carries its savepoint instead of BEGIN.
func TestHandlerTxConformance(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		for _, group := range []bool{false, true} {
			name := mode
			if group {
				name += "/group"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				testHandlerTxConformance(t, mode, group)
			})
		}
	}
}

func testHandlerTxConformance(t *testing.T, execMode string, group bool) {
	b := setup(t)
	ctx := ctxT(t, 2*time.Minute)
	if _, err := b.pool.Exec(ctx, `
		CREATE TABLE conf (run text, n int, label text NOT NULL, PRIMARY KEY (run, n));
		CREATE TABLE conf_lo (run text, lo oid)`); err != nil {
		t.Fatal(err)
	}
	url := withParam(t, b.url, "default_query_exec_mode", execMode)
	plain := confPool(t, url)

	// The worker runs script i as task "i" once: a second attempt (after a
	// handler that returned nil in an aborted transaction) only ends the task.
	recs := make(chan *confRec, 1)
	qc := QueueConfig{Concurrency: 1}
	if group {
		qc.GroupCommit = GroupCommit{MaxTasks: 1}
	}
	h := b.startOn(t, confPool(t, url), WorkerConfig{}, func(w *worker) {
		err := w.HandleTx("conf", func(ctx context.Context, tx pgx.Tx, tk *Task) error {
			if tk.Attempt > 1 {
				return NoRetry(errors.New("ran once"))
			}
			i, err := strconv.Atoi(tk.ID)
			if err != nil {
				return NoRetry(err)
			}
			r := &confRec{run: fmt.Sprintf("w%03d", i)}
			err = confRun(ctx, confScripts[i], tx, r)
			recs <- r
			if err != nil {
				return NoRetry(err)
			}
			return nil
		}, qc)
		if err != nil {
			t.Fatal(err)
		}
	})

	for i, s := range confScripts {
		id := strconv.Itoa(i)
		b.enqueue(t, task("conf", id))
		f := h.next(t)
		workerCommitted := f.out == outSucceeded
		switch f.out {
		case outSucceeded, outDead:
		case outRetried:
			h.expect(t, id, outDead)
		default:
			t.Fatalf("%s: run ended %q; log:\n%s", s.name, f.out, h.logs)
		}
		var w *confRec
		select {
		case w = <-recs:
		case <-ctx.Done():
			t.Fatalf("%s: no record of the handler", s.name)
		}

		p := &confRec{run: fmt.Sprintf("p%03d", i)}
		tx, err := plain.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		plainCommitted := false
		if err := confRun(ctx, s, tx, p); err != nil {
			_ = tx.Rollback(ctx)
		} else {
			plainCommitted = tx.Commit(ctx) == nil
		}

		wrote, want := confCommitted(t, b, w.run), confCommitted(t, b, p.run)
		if slices.Contains(s.differs, execMode) {
			if len(wrote) > 0 && !slices.Equal(wrote, want) {
				t.Errorf("%s: the handler committed %q, the pgx.Tx %q", s.name, wrote, want)
			}
			t.Logf("%s: known to differ; the handler's transaction saw\n\t%s", s.name, strings.Join(w.out, "\n\t"))
			continue
		}
		if !slices.Equal(w.out, p.out) {
			t.Errorf("%s: the handler's transaction saw\n\t%s\na pgx.Tx saw\n\t%s", s.name,
				strings.Join(w.out, "\n\t"), strings.Join(p.out, "\n\t"))
		}
		if workerCommitted != plainCommitted {
			t.Errorf("%s: the worker committed %v (%s), the pgx.Tx %v", s.name, workerCommitted, f.out, plainCommitted)
		}
		if !slices.Equal(wrote, want) {
			t.Errorf("%s: the handler committed %q, the pgx.Tx %q", s.name, wrote, want)
		}
	}
}
