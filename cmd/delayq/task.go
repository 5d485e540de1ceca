package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
)

const taskUsage = `Usage: delayq task show --queue q --id x [--json]

Shows one task as its outbox row holds it (state, version, attempts, due and finish
times, last error, payload size) and its attempt history: each run that did not
succeed, with its outcome, time and error, and for a panic its stack; a done task's
success last. The row keeps its newest 20 such runs (64 KiB; an error cut to 1 KiB,
a stack to 8 KiB) and the retention deletes them with it. Reads PostgreSQL alone.

For a task of a workflow (package workflow): the dependencies it still waits on,
with their states and policies; the dependents still waiting on it (their count
and the first 10; --json the first 100); and its stored result (text when it is
UTF-8, else base64). A dependency's edge is deleted as it settles, so a finished
one is not listed. For a batch's callback (workflow.Client.Batch): the batch's
progress, its children finished of all, and how many ended done, dead and
cancelled.

Examples:
  delayq task show --queue payment --id order-1001
  delayq task show --queue payment --id order-1001 --json

Environment: DATABASE_URL (the flag overrides it).
Exit codes: 0 ok, 1 failure (no such task), 2 usage error.
`

func runTask(ctx context.Context, m *Main, args []string) error {
	if len(args) == 0 {
		return usagef("want an action: show (see --help)")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(m.Stdout, taskUsage)
		return errHelp
	case "show":
		return runTaskShow(ctx, m, args[1:])
	}
	return usagef("unknown action %q: want show", args[0])
}

// taskShowOptions is what 'delayq task show' was asked.
type taskShowOptions struct {
	conn connFlags
	task taskFlags
	json bool
}

func (o *taskShowOptions) parse(m *Main, args []string) error {
	fs := newFlagSet(m, "task show", "task show --queue q --id x [--json]",
		"  delayq task show --queue payment --id order-1001\n"+
			"  delayq task show --queue payment --id order-1001 --json\n")
	o.conn.register(fs, m, true, false)
	o.task.register(fs)
	fs.BoolVar(&o.json, "json", false, "print the task and its history as JSON")
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	return o.task.check()
}

// taskView is what 'delayq task show --json' prints.
type taskView struct {
	Queue       string               `json:"queue"`
	ID          string               `json:"id"`
	State       delayqtype.State     `json:"state"`
	Version     int                  `json:"version"`
	Attempt     int                  `json:"attempt"`
	MaxAttempts int                  `json:"max_attempts"`
	Priority    int                  `json:"priority"`
	RunAt       time.Time            `json:"run_at"`
	CreatedAt   time.Time            `json:"created_at"`
	DoneAt      *time.Time           `json:"done_at,omitempty"`
	LastError   string               `json:"last_error,omitempty"`
	PayloadSize int                  `json:"payload_bytes"`
	Attempts    []delayqtype.Attempt `json:"attempts"`
	// The workflow's part (issue 33): the dependencies still waited on, the
	// dependents still waiting (the first ones, and their count), the result.
	WaitsFor        int         `json:"waits_for,omitempty"`
	Dependencies    []linkView  `json:"dependencies,omitempty"`
	Dependents      []linkView  `json:"dependents,omitempty"`
	DependentsCount int         `json:"dependents_count,omitempty"`
	Result          *resultView `json:"result,omitempty"`
	// Batch: the task is a batch's callback; its children's progress.
	Batch *batchView `json:"batch,omitempty"`
}

// batchView is a batch's counter: its children, those not finished, and how
// the others ended.
type batchView struct {
	Total      int        `json:"total"`
	Remaining  int        `json:"remaining"`
	Done       int        `json:"done"`
	Dead       int        `json:"dead"`
	Cancelled  int        `json:"cancelled"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// linkView is a dependency or a dependent: the task, its state ("" without a
// row), the edge's policy when the dependency dies or is cancelled.
type linkView struct {
	Queue  string           `json:"queue"`
	ID     string           `json:"id"`
	State  delayqtype.State `json:"state"`
	Policy string           `json:"policy"`
}

// resultView is a stored result: its text when it is UTF-8, else base64.
type resultView struct {
	Bytes     int    `json:"bytes"`
	Text      string `json:"text,omitempty"`
	Base64    string `json:"base64,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
}

const (
	dependentsListed = 100   // --json; the text shows the first 10
	dependentsCap    = 10000 // counted up to
)

// runTaskShow reads the row with its attempt history in one query
// (internal/taskstate, as Client.Attempts does: the client has no task view).
func runTaskShow(ctx context.Context, m *Main, args []string) error {
	var o taskShowOptions
	if err := o.parse(m, args); err != nil {
		return err
	}
	s, err := o.conn.openStores(ctx, false)
	if err != nil {
		return err
	}
	defer s.close()
	q, id := o.task.queue, o.task.id
	row, ok, err := taskstate.NewBrowser(taskstate.Config{Schema: o.conn.schema}).Task(ctx, s.pool, q, id, 0)
	switch {
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("%s/%s: %w", q, id, outbox.ErrNotFound)
	}
	v := taskView{Queue: row.Queue, ID: row.ID, State: row.State, Version: row.Version, Attempt: row.Attempt,
		MaxAttempts: row.MaxAttempts, Priority: row.Priority, RunAt: row.RunAt, CreatedAt: row.CreatedAt,
		LastError: row.LastError, PayloadSize: row.PayloadBytes, Attempts: row.Attempts}
	if !row.DoneAt.IsZero() {
		v.DoneAt = &row.DoneAt
	}
	if v.Attempts == nil {
		v.Attempts = []delayqtype.Attempt{}
	}
	if err := showLinks(ctx, s.pool, o.conn.schema, row, &v); err != nil {
		return err
	}
	if o.json {
		return writeJSON(m.Stdout, v)
	}
	return printTask(m, v)
}

func printTask(m *Main, v taskView) error {
	tw := newTable(m.Stdout, fmt.Sprintf("task\t%s/%s", v.Queue, v.ID))
	fmt.Fprintf(tw, "state\t%s\n", v.State)
	fmt.Fprintf(tw, "version\t%d\n", v.Version)
	fmt.Fprintf(tw, "attempts\t%d of %d\n", v.Attempt, v.MaxAttempts)
	fmt.Fprintf(tw, "priority\t%d\n", v.Priority)
	fmt.Fprintf(tw, "due\t%s\n", stamp(v.RunAt))
	fmt.Fprintf(tw, "created\t%s\n", stamp(v.CreatedAt))
	if v.DoneAt != nil {
		fmt.Fprintf(tw, "finished\t%s\n", stamp(*v.DoneAt))
	}
	fmt.Fprintf(tw, "last error\t%s\n", cmpDash(oneLine(cut(v.LastError, 200))))
	fmt.Fprintf(tw, "payload\t%d bytes\n", v.PayloadSize)
	switch b := v.Batch; {
	case b != nil:
		fmt.Fprintf(tw, "batch\t%d of %d children finished: %d done, %d dead, %d cancelled\n",
			b.Total-b.Remaining, b.Total, b.Done, b.Dead, b.Cancelled)
		if b.FinishedAt != nil {
			fmt.Fprintf(tw, "last child\t%s\n", stamp(*b.FinishedAt))
		}
	case v.State == delayqtype.StateWaiting:
		fmt.Fprintf(tw, "waits for\t%d unfinished dependencies\n", v.WaitsFor)
	}
	if r := v.Result; r != nil {
		shown := strconv.Quote(cut(r.Text, 200))
		if r.Base64 != "" {
			shown = "base64 " + cut(r.Base64, 200)
		}
		fmt.Fprintf(tw, "result\t%d bytes: %s\n", r.Bytes, shown)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := printLinks(m, v); err != nil {
		return err
	}
	fmt.Fprintln(m.Stdout)
	if len(v.Attempts) == 0 {
		fmt.Fprintln(m.Stdout, "no run recorded")
		return nil
	}
	tw = newTable(m.Stdout, "VERSION\tATTEMPT\tOUTCOME\tAT\tERROR")
	for _, a := range v.Attempts {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\n", a.Version, a.Attempt, a.Outcome, stamp(a.At), cmpDash(oneLine(cut(a.Error, 200))))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, a := range v.Attempts {
		if a.Stack == "" {
			continue
		}
		fmt.Fprintf(m.Stdout, "\nstack of version %d, attempt %d:\n", a.Version, a.Attempt)
		for line := range strings.Lines(a.Stack) {
			fmt.Fprint(m.Stdout, "  ", line)
		}
		if !strings.HasSuffix(a.Stack, "\n") {
			fmt.Fprintln(m.Stdout)
		}
	}
	return nil
}

// cmpDash is s, or "-" for "".
func cmpDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// showLinks adds to v the workflow's part of row: its result, and for a task
// that waits or has dependents, its edges still waiting.
func showLinks(ctx context.Context, q taskstate.Querier, schema string, row taskstate.TaskRow, v *taskView) error {
	if row.Result != nil {
		r := &resultView{Bytes: row.ResultBytes, Truncated: row.ResultBytes > len(row.Result)}
		if utf8.Valid(row.Result) {
			r.Text = string(row.Result)
		} else {
			r.Base64 = base64.StdEncoding.EncodeToString(row.Result)
		}
		v.Result = r
	}
	d := taskstate.NewDepsReader(taskstate.Config{Schema: schema})
	b, ok, err := d.Batch(ctx, q, row.Queue, row.ID)
	if err != nil {
		return err
	}
	if ok {
		v.Batch = &batchView{Total: b.Total, Remaining: b.Remaining, Done: b.Done, Dead: b.Dead, Cancelled: b.Cancelled}
		if !b.FinishedAt.IsZero() {
			v.Batch.FinishedAt = &b.FinishedAt
		}
	}
	if row.State != taskstate.Waiting && !row.HasDependents {
		return nil
	}
	view := func(ls []taskstate.Link) []linkView {
		out := make([]linkView, len(ls))
		for i, l := range ls {
			out[i] = linkView{Queue: l.Queue, ID: l.ID, State: l.State, Policy: l.Policy}
		}
		return out
	}
	if row.State == taskstate.Waiting {
		v.WaitsFor = row.WaitsFor
		deps, err := d.Dependencies(ctx, q, row.Queue, row.ID, 1000)
		if err != nil {
			return err
		}
		v.Dependencies = view(deps)
	}
	deps, n, err := d.Dependents(ctx, q, row.Queue, row.ID, dependentsListed, dependentsCap)
	if err != nil {
		return err
	}
	v.Dependents, v.DependentsCount = view(deps), n
	return nil
}

// printLinks prints a task's dependencies and its first 10 dependents.
func printLinks(m *Main, v taskView) error {
	table := func(head string, ls []linkView) error {
		tw := newTable(m.Stdout, head+"\tSTATE\tPOLICY")
		for _, l := range ls {
			fmt.Fprintf(tw, "%s/%s\t%s\t%s\n", l.Queue, l.ID, cmpDash(string(l.State)), l.Policy)
		}
		return tw.Flush()
	}
	if len(v.Dependencies) > 0 {
		fmt.Fprintln(m.Stdout)
		if err := table("DEPENDENCY (unfinished)", v.Dependencies); err != nil {
			return err
		}
	}
	if v.DependentsCount > 0 {
		more := ""
		if v.DependentsCount >= dependentsCap {
			more = " or more"
		}
		fmt.Fprintf(m.Stdout, "\n%d%s dependents waiting on it", v.DependentsCount, more)
		if v.DependentsCount > 10 {
			fmt.Fprint(m.Stdout, ", the first 10")
		}
		fmt.Fprintln(m.Stdout, ":")
		if err := table("DEPENDENT", v.Dependents[:min(10, len(v.Dependents))]); err != nil {
			return err
		}
	}
	return nil
}
