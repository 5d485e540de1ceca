package transition_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The writes of a task's state that only internal/transition makes.
var (
	// redisWrites are the methods of delayq.Client that write a task into
	// Redis or settle it there.
	redisWrites = []string{"Complete", "CompleteMany", "Kill", "Retry", "Release", "ReleaseAfter", "Reap",
		"RepairIf", "RepairIfRouted", "Remove", "Enqueue", "EnqueuePipelined"}
	// redisOnly are those whose name no other API of the module uses: flagged
	// on any receiver (but the owner's, ops).
	redisOnly = []string{"CompleteMany", "ReleaseAfter", "RepairIf", "RepairIfRouted", "EnqueuePipelined"}
	// clientNames are the names the module gives a *delayq.Client (fields,
	// variables): the other methods are flagged on these.
	clientNames = []string{"dq", "DelayQ", "Redis"}
	// writeStatements are the fields of taskstate.Statements that write the
	// outbox table.
	writeStatements = []string{"Enqueue", "EnqueueStartBy", "EnqueueMany", "EnqueueReplace", "Cancel", "Reschedule",
		"Guard", "GuardAbort", "GuardMany", "GuardGroup", "RecordFailure", "NoteLost", "Snooze", "CancelRun", "MissDeadline",
		"TakeDeadHook", "DelayDeadHook", "TakeDue", "TakeDueQueues", "MarkInvalid", "MarkDead", "Prune",
		"RetryDead", "RetryDeadEdited", "PurgeDead", "EnqueueWaiting", "SetResult",
		"EnqueueBatch", "ReleaseBatch", "CancelBatch", "CancelTasks"}
	// statementNames are the names the module gives a taskstate.Statements.
	statementNames = []string{"SQL", "sql", "st", "statements"}
	// storeWrites are the methods of taskstate.Store that write the outbox.
	storeWrites = []string{"MarkDone", "MarkDoneMany", "MarkDoneSQL", "QueueGuardGroup", "RecordFailure", "NoteLost",
		"Snooze", "CancelRun", "MissDeadline", "TakeDeadHook", "DelayDeadHook"}
)

// exception lets a directory (relative to the module root, "*" for any) make
// the writes named (nil: all) in files whose base name is listed (nil: all).
type exception struct {
	dir, reason string
	files, may  []string
}

var exceptions = []exception{
	{dir: "internal/transition", reason: "the owner"},
	{dir: "internal/taskstate", reason: "defines the statements and the Store methods the owner runs"},
	{dir: "internal/dispatch", reason: "the Redis engine defines the scripts' methods"},
	{dir: "outbox", may: []string{"Enqueue", "EnqueueStartBy", "EnqueueMany", "EnqueueReplace"},
		reason: "the producer's insert (enqueue, and enqueue-replace of its key's row: Postgres only, in the caller's transaction, on pgx or database/sql)"},
	{dir: "workflow", may: []string{"EnqueueWaiting", "SetResult", "EnqueueBatch", "ReleaseBatch", "CancelBatch", "CancelTasks"},
		reason: "the insert of a waiting task (enqueue-waiting) or a batch (enqueue-batch) and the cancel of a workflow (workflow-cancel): Postgres only, in the caller's transaction; and a handler's result (set-result, in its run's transaction)"},
	{dir: "internal/bench", files: []string{"memory.go", "bounds.go"}, may: []string{"Enqueue"},
		reason: "benchmarks of the Redis engine alone seed it without an outbox"},
	{dir: "internal/bench", files: []string{"fairness.go"}, may: []string{"Enqueue", "Complete"},
		reason: "the fairness benchmark drives the claim script alone: it seeds and completes tasks without an outbox, on a prefix of its own"},
}

// violations lists the writes f makes outside the owner, as "position: what".
func violations(fset *token.FileSet, f *ast.File) []string {
	var out []string
	flag := func(n ast.Node, what string) { out = append(out, fset.Position(n.Pos()).String()+": "+what) }
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			m, recv := sel.Sel.Name, lastName(sel.X)
			switch {
			case recv == "ops":
			case slices.Contains(redisWrites, m) && (slices.Contains(clientNames, recv) || slices.Contains(redisOnly, m)):
				flag(n, "Redis write "+m)
			case slices.Contains(storeWrites, m) && (recv == "store" || isCallOf(sel.X, "taskstate", "New")):
				flag(n, "outbox write Store."+m)
			}
		case *ast.SelectorExpr:
			if slices.Contains(writeStatements, n.Sel.Name) &&
				(slices.Contains(statementNames, lastName(n.X)) || isCallOf(n.X, "taskstate", "NewStatements")) {
				flag(n, "outbox write statement "+n.Sel.Name)
			}
		}
		return true
	})
	return out
}

// lastName is the last identifier of x: dq for dq, w.dq or e.cfg.dq.
func lastName(x ast.Expr) string {
	switch x := x.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		return x.Sel.Name
	}
	return ""
}

func isCallOf(x ast.Expr, pkg, fn string) bool {
	c, ok := x.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == pkg && sel.Sel.Name == fn
}

// TestOneOwnerOfTransitions scans every Go file of the module: outside the
// owner (and the exceptions, each with its reason), nothing writes a task's
// state: no Redis write script of delayq.Client, no outbox write statement, no
// write method of taskstate.Store. A caller that wrote on its own could write
// Redis before Postgres's commit, or without it. Test files are not scanned:
// they set up what the transitions forbid (a task in Redis without a row, a
// crash between the two writes). The scan goes by the names the module gives
// a delayq.Client and taskstate.Statements (clientNames, statementNames).
func TestOneOwnerOfTransitions(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root %s: %v", root, err)
	}
	fset := token.NewFileSet()
	scanned := 0
	used := make([]bool, len(exceptions))
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		dir := filepath.ToSlash(filepath.Dir(rel))
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		scanned++
		for _, v := range violations(fset, f) {
			if i := excepted(dir, filepath.Base(rel), v); i >= 0 {
				used[i] = true
			} else {
				t.Errorf("%s: make it through internal/transition's operation", v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if scanned < 100 {
		t.Fatalf("scanned %d Go files under %s: the walk missed the module", scanned, root)
	}
	for i, e := range exceptions {
		if !used[i] && e.dir != "internal/transition" && e.dir != "internal/taskstate" {
			t.Errorf("exception for %s (%s) excuses nothing: remove it", e.dir, e.reason)
		}
	}
}

// excepted returns the index of the exception that allows violation in
// dir/file, or -1.
func excepted(dir, file, violation string) int {
	for i, e := range exceptions {
		if e.dir != dir || e.files != nil && !slices.Contains(e.files, file) {
			continue
		}
		if e.may == nil {
			return i
		}
		for _, m := range e.may {
			if strings.HasSuffix(violation, " "+m) {
				return i
			}
		}
	}
	return -1
}

// The scan catches the writes it is for, and leaves the owner's operations and
// the APIs that share a name alone.
func TestOwnerScanCatchesPlantedWrites(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code string
		want int
	}{
		{`w.dq.Complete(ctx, q, id, tok)`, 1},
		{`w.dq.CompleteMany(ctx, q, leases)`, 1},
		{`dq.Remove(ctx, q, id)`, 1},
		{`e.DelayQ.Enqueue(ctx, q, task)`, 1},
		{`h.cfg.Redis.Kill(ctx, q, id, tok, msg)`, 1},
		{`x.client.RepairIf(ctx, q)`, 1},
		{`r.pool.Exec(ctx, r.sql.MarkDead, qs)`, 1},
		{`conn.Exec(ctx, w.store.SQL.Guard, q, id)`, 1},
		{`db.Query(ctx, st.PurgeDead, qs)`, 1},
		{`tx.Exec(ctx, taskstate.NewStatements(cfg).Cancel, q, id)`, 1},
		{`w.store.RecordFailure(ctx, tx, f)`, 1},
		{`taskstate.New(cfg).MarkDoneMany(ctx, db, done)`, 1},
		// Not writes of a task: the owner, reads, and other APIs sharing a name.
		{`w.ops.Retry(ctx, db, c, f, d, false)`, 0},
		{`r.ops.Reap(ctx, q, 100)`, 0},
		{`conn.Release()`, 0},
		{`ob.Enqueue(ctx, tx, task)`, 0},
		{`ob.Cancel(ctx, tx, q, id)`, 0},
		{`w.store.Row(ctx, db, q, id)`, 0},
		{`db.Query(ctx, st.ListDead, qs)`, 0},
		{`w.dq.Claim(ctx, q)`, 0},
	} {
		src := "package p\nfunc f() {\n" + c.code + "\n}\n"
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "p.go", src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("%s: %v", c.code, err)
		}
		if got := violations(fset, f); len(got) != c.want {
			t.Errorf("%s: %d violations %q, want %d", c.code, len(got), got, c.want)
		}
	}
}
